#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise_grad_input: gx of a depthwise convolution (ops::Conv2d), gathered: an invocation
// computes four neighbouring inputs q of a row, each the sum of w[c][ky][kx] ·
// G[c][(q + pad − (ky, kx)) / stride] over the taps whose source lands on the stride grid
// inside the output, each weight loaded once for the four and the row decomposed once (as
// depthwise.comp). G is the output gradient masked by y > 0 with a ReLU. A grid-stride loop
// covers any grid (lower.rs: one invocation per four inputs).

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
    uint quads = (pc.w + 3u) / 4u; // blocks of four inputs along a row
    uint rows = pc.n * pc.c_in * pc.h;
    uint len = rows * quads;
    uint taps = pc.k * pc.k;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint row = i / quads; // (b·c + c)·h + iy
        uint ix0 = (i - row * quads) * 4u;
        uint bc = row / pc.h;
        uint iy = row - bc * pc.h;
        uint c = bc % pc.c_in;
        uint gbase = bc * pc.out_h * pc.out_w;
        vec4 s = vec4(0.0);
        for (uint ky = 0u; ky < pc.k; ky++) {
            uint oy = on_grid(iy + pc.pad - ky, pc.out_h);
            if (oy >= pc.out_h) {
                continue;
            }
            uint grow = gbase + oy * pc.out_w;
            for (uint kx = 0u; kx < pc.k; kx++) {
                float wv = wt[c * taps + ky * pc.k + kx];
                for (uint j = 0u; j < 4u; j++) {
                    uint ox = on_grid(ix0 + j + pc.pad - kx, pc.out_w);
                    if (ox < pc.out_w) {
                        uint idx = grow + ox;
                        float g = gy[idx];
                        if (pc.relu == 0u || y[idx] > 0.0) {
                            s[j] += wv * g;
                        }
                    }
                }
            }
        }
        uint in_row = row * pc.w;
        for (uint j = 0u; j < 4u; j++) {
            if (ix0 + j < pc.w) {
                gx[in_row + ix0 + j] = s[j];
            }
        }
    }
}
