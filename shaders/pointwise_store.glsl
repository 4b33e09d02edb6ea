// The pointwise kernels' store (pointwise.glsl, pointwise_thin.glsl): output element `at`
// gets `v` (the sum plus the bias), after the ReLU where pc.relu, plus the residual where
// pc.skip (binding 4, shaped as y).
void store_output(uint at, float v) {
    if (pc.relu != 0u) {
        v = max(v, 0.0);
    }
    if (pc.skip != 0u) {
        v += skip[at];
    }
    y[at] = v;
}
