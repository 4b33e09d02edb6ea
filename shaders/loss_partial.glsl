// loss_partial: first pass of the detector's loss (ops::CenterLoss). Workgroup g sums, over
// its cells_per_part grid cells, the focal loss of every class channel, the L1 of the
// offsets and of the log sizes and 1 − GIoU of the boxes, each weighted by the cell's mask
// (1 at centres, the neighbour weight around them), and the number of centre cells;
// workgroup_sum.glsl adds the 256 invocations' sums in a fixed order and the workgroup
// writes its sums to partial[8·g ..] as two vec4s (focal, offset, size, centres), (giou, 0,
// 0, 0). loss_finish adds the parts (deterministic: no float atomics).
// With one part this pass writes the final loss itself. loss_partial_subgroup.comp is the
// same with SUBGROUPS defined.
//
// Loss tensor (recording::LOSS_LEN): [total, focal, offset, size, centres, giou], everything
// but centres divided by max(1, centres), the box terms weighted.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Pred { float pred[]; };
layout(std430, set = 0, binding = 1) readonly buffer Target { float target[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Loss { float loss[]; };

#include "loss.glsl"

#define WG_SIZE 256u
#include "workgroup_sum.glsl"

void main() {
    uint plane = pc.grid_h * pc.grid_w;
    uint cells = pc.n * plane;
    uint begin = gl_WorkGroupID.x * pc.cells_per_part;
    uint end = min(cells, begin + pc.cells_per_part);
    vec4 s = vec4(0.0); // focal, offset L1, size L1, centres
    float sg = 0.0;     // 1 − GIoU
    for (uint i = begin + gl_LocalInvocationID.x; i < end; i += 256u) {
        uint b = i / plane;
        uint q = i - b * plane;
        uint pb = b * (pc.classes + 4u) * plane + q;
        uint tb = b * (pc.classes + 5u) * plane + q;
        for (uint c = 0u; c < pc.classes; c++) {
            float l = pred[pb + c * plane];
            float y = target[tb + c * plane];
            if (y == 1.0) {
                // −(1 − p)^α · ln p, ln p = −softplus(−l), 1 − p = sigmoid(−l)
                s.x += pow_e(sigmoid(-l), pc.alpha) * softplus(-l);
            } else {
                // −(1 − y)^β · p^α · ln(1 − p), ln(1 − p) = −softplus(l)
                s.x += pow_e(1.0 - y, pc.beta) * pow_e(sigmoid(l), pc.alpha) * softplus(l);
            }
        }
        float m = target[tb + (pc.classes + 4u) * plane];
        if (m > 0.0) {
            s.y += m * (abs(pred[pb + pc.classes * plane] - target[tb + pc.classes * plane])
                + abs(pred[pb + (pc.classes + 1u) * plane]
                    - target[tb + (pc.classes + 1u) * plane]));
            s.z += m * (abs(pred[pb + (pc.classes + 2u) * plane]
                    - target[tb + (pc.classes + 2u) * plane])
                + abs(pred[pb + (pc.classes + 3u) * plane]
                    - target[tb + (pc.classes + 3u) * plane]));
            s.w += m == 1.0 ? 1.0 : 0.0;
            vec4 p = vec4(pred[pb + pc.classes * plane], pred[pb + (pc.classes + 1u) * plane],
                pred[pb + (pc.classes + 2u) * plane], pred[pb + (pc.classes + 3u) * plane]);
            vec4 t = vec4(target[tb + pc.classes * plane],
                target[tb + (pc.classes + 1u) * plane], target[tb + (pc.classes + 2u) * plane],
                target[tb + (pc.classes + 3u) * plane]);
            vec4 unused;
            sg += m * giou(p, t, unused);
        }
    }
    vec4 t = workgroup_sum4(s);
    float g = workgroup_sum(sg);
    if (gl_LocalInvocationID.x == 0u) {
        if (pc.parts > 1u) {
            uint at = 8u * gl_WorkGroupID.x;
            partial[at] = t.x;
            partial[at + 1u] = t.y;
            partial[at + 2u] = t.z;
            partial[at + 3u] = t.w;
            partial[at + 4u] = g;
            partial[at + 5u] = 0.0;
            partial[at + 6u] = 0.0;
            partial[at + 7u] = 0.0;
        } else {
            write_loss(t, g);
        }
    }
}
