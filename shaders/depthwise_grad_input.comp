#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise_grad_input: gx of a depthwise convolution (ops::Conv2d), gathered: one invocation
// per input element sums w[c][ky][kx] · G[c][(q + pad − (ky, kx)) / stride] over the taps
// whose source lands on the stride grid inside the output. G is the output gradient masked
// by y > 0 with a ReLU. A grid-stride loop covers any grid.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer GX { float gx[]; };

#include "conv_push.glsl"

// s / stride where s is a multiple of the stride, else a value ≥ limit (no term); s wraps
// to a huge value when the difference it came from is negative. Strides 1 and 2 (det-s's)
// avoid the integer division, slow on GPUs and worse on CPU SIMD.
uint on_grid(uint s, uint limit) {
    if (pc.stride == 1u) {
        return s;
    }
    if (pc.stride == 2u) {
        return (s & 1u) == 0u ? s >> 1 : limit;
    }
    uint d = s / pc.stride;
    return d * pc.stride == s ? d : limit;
}

void main() {
    uint plane = pc.h * pc.w;
    uint len = pc.n * pc.c_in * plane;
    uint taps = pc.k * pc.k;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint bc = i / plane;
        uint q = i - bc * plane;
        uint c = bc % pc.c_in;
        uint iy = q / pc.w;
        uint ix = q - iy * pc.w;
        uint gbase = bc * pc.out_h * pc.out_w;
        float s = 0.0;
        for (uint ky = 0u; ky < pc.k; ky++) {
            uint oy = on_grid(iy + pc.pad - ky, pc.out_h);
            if (oy >= pc.out_h) {
                continue;
            }
            for (uint kx = 0u; kx < pc.k; kx++) {
                uint ox = on_grid(ix + pc.pad - kx, pc.out_w);
                if (ox >= pc.out_w) {
                    continue;
                }
                uint idx = gbase + oy * pc.out_w + ox;
                float g = gy[idx];
                if (pc.relu == 0u || y[idx] > 0.0) {
                    s += wt[c * taps + ky * pc.k + kx] * g;
                }
            }
        }
        gx[i] = s;
    }
}
