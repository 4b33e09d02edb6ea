#version 450
#extension GL_GOOGLE_include_directive : require
// conv_grad_bias: the bias gradient alone of any convolution (ops::Conv2d) whose weight is
// frozen (fine-tuning with `--train-biases`): gb[c] = Σ over images b and output pixels p of
// G[b][c][p], G the output gradient masked by y > 0 with a ReLU. Workgroup c sums channel c:
// each invocation a strided subset of the batch's pixels, then workgroup_sum.glsl adds the
// 256 partial sums in a fixed order (deterministic, no atomics).
//
// Grid: (c_out, 1, 1). 256 invocations, 1 KiB of shared memory.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 1) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 2) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

#define WG_SIZE 256u
#include "workgroup_sum.glsl"

void main() {
    uint c = gl_WorkGroupID.x;
    uint plane_out = pc.out_h * pc.out_w;
    uint total = pc.n * plane_out;
    float s = 0.0;
    for (uint e = gl_LocalInvocationID.x; e < total; e += 256u) {
        uint b = e / plane_out;
        uint idx = (b * pc.c_out + c) * plane_out + (e - b * plane_out);
        float g = gy[idx];
        if (pc.relu == 0u || y[idx] > 0.0) {
            s += g;
        }
    }
    float v = workgroup_sum(s);
    if (gl_LocalInvocationID.x == 0u) {
        gb[c] = v;
    }
}
