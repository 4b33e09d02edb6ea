// The loss's gradient with respect to the predictions (ops::CenterLoss), for loss_grad.comp
// and loss_grad_finish.comp: one invocation per prediction element (grid-stride loop), all
// divided by N (1 / N is `inv`). With p = sigmoid(l), q = 1 − p:
//   y = 1:      d/dl[q^α · softplus(−l)]              = −q^α · (α·p·softplus(−l) + q)
//   otherwise:  d/dl[(1 − y)^β · p^α · softplus(l)]   = (1 − y)^β · p^α · (α·q·softplus(l) + p)
// and for the four regression channels weight · sign(pred − target) plus giou_weight times
// the GIoU gradient (loss.glsl), times the cell's mask where it is above 0 (sign(0) = 0),
// zero elsewhere. The includer declares pred, target and grad and includes loss.glsl.

void loss_gradients(float inv) {
    uint plane = pc.grid_h * pc.grid_w;
    uint pc_channels = pc.classes + 4u;
    uint len = pc.n * pc_channels * plane;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint bc = i / plane;
        uint q = i - bc * plane;
        uint b = bc / pc_channels;
        uint c = bc - b * pc_channels;
        uint tb = b * (pc.classes + 5u) * plane + q;
        float l = pred[i];
        float g = 0.0;
        if (c < pc.classes) {
            float y = target[tb + c * plane];
            float p = sigmoid(l);
            float qq = sigmoid(-l);
            if (y == 1.0) {
                g = -pow_e(qq, pc.alpha) * (pc.alpha * p * softplus(-l) + qq);
            } else {
                g = pow_e(1.0 - y, pc.beta) * pow_e(p, pc.alpha)
                    * (pc.alpha * qq * softplus(l) + p);
            }
        } else {
            float m = target[tb + (pc.classes + 4u) * plane];
            if (m > 0.0) {
                float d = l - target[tb + c * plane];
                float wgt = c < pc.classes + 2u ? pc.offset_weight : pc.size_weight;
                uint pr = b * pc_channels * plane + pc.classes * plane + q;
                uint tr = tb + pc.classes * plane;
                vec4 p = vec4(pred[pr], pred[pr + plane], pred[pr + 2u * plane],
                    pred[pr + 3u * plane]);
                vec4 t = vec4(target[tr], target[tr + plane], target[tr + 2u * plane],
                    target[tr + 3u * plane]);
                vec4 dg;
                giou(p, t, dg);
                g = m * (wgt * sign(d) + pc.giou_weight * dg[c - pc.classes]);
            }
        }
        grad[i] = g * inv;
    }
}
