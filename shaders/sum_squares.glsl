// sum_squares: the gradients' shares of the global norm that gradient-norm clipping needs
// (clip_grad.comp): workgroup k sums the squares of binding k's len[k] values into
// sums[2 + first_slot + k]. Each invocation takes a strided subset, then workgroup_sum.glsl
// adds the 256 partial sums in a fixed order: deterministic, no atomics. Up to four
// gradients a dispatch (the lowering groups consecutive ones); the dispatch has one workgroup
// per gradient it binds, and the bindings past those repeat the last.
// sum_squares_subgroup.comp is the same with SUBGROUPS defined.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer G0 { float g0[]; };
layout(std430, set = 0, binding = 1) readonly buffer G1 { float g1[]; };
layout(std430, set = 0, binding = 2) readonly buffer G2 { float g2[]; };
layout(std430, set = 0, binding = 3) readonly buffer G3 { float g3[]; };
layout(std430, set = 0, binding = 4) buffer Sums { float sums[]; };

layout(push_constant) uniform Push {
    uint len0;
    uint len1;
    uint len2;
    uint len3;
    uint first_slot;
} pc;

#define WG_SIZE 256u
#include "workgroup_sum.glsl"

void main() {
    uint k = gl_WorkGroupID.x;
    uint lane = gl_LocalInvocationID.x;
    float s = 0.0;
    // k is the same for the whole workgroup: every invocation takes the same branch.
    if (k == 0u) {
        for (uint i = lane; i < pc.len0; i += 256u) { s += g0[i] * g0[i]; }
    } else if (k == 1u) {
        for (uint i = lane; i < pc.len1; i += 256u) { s += g1[i] * g1[i]; }
    } else if (k == 2u) {
        for (uint i = lane; i < pc.len2; i += 256u) { s += g2[i] * g2[i]; }
    } else {
        for (uint i = lane; i < pc.len3; i += 256u) { s += g3[i] * g3[i]; }
    }
    float total = workgroup_sum(s);
    if (lane == 0u) {
        sums[2u + pc.first_slot + k] = total;
    }
}
