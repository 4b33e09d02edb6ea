// Shared by the loss kernels (ops::CenterLoss): push constants and the numerically safe
// pieces of the focal loss.

layout(push_constant) uniform Push {
    uint n;
    uint classes;
    uint grid_h;
    uint grid_w;
    float alpha;
    float beta;
    float offset_weight;
    float size_weight;
    uint parts;          // loss_partial: workgroups of the first pass
    uint cells_per_part; // loss_partial: grid cells each of them sums
} pc;

// ln(1 + e) for e ≥ 0, accurate for tiny e too (GLSL has no log1p): the classic
// log(u)·e/(u − 1) with u = 1 + e rounded, exact to a few ulp.
float log1p_pos(float e) {
    precise float u = 1.0 + e;
    if (u == 1.0) {
        return e;
    }
    precise float d = u - 1.0;
    return log(u) * (e / d);
}

// softplus(x) = ln(1 + eˣ), finite for every x.
float softplus(float x) {
    return max(x, 0.0) + log1p_pos(exp(-abs(x)));
}

// x^e, by multiplication for small whole exponents (CenterNet's 2 and 4: exact, and no
// pow(0, e) edge case), pow otherwise.
float pow_e(float x, float e) {
    if (e == floor(e) && e >= 0.0 && e <= 8.0) {
        float r = 1.0;
        for (int i = 0; i < int(e); i++) {
            r *= x;
        }
        return r;
    }
    return pow(x, e);
}

// 1 / (1 + e^−x), and 1 − that computed as 1 / (1 + eˣ) (no cancellation near 1).
float sigmoid(float x) {
    return 1.0 / (1.0 + exp(-x));
}
