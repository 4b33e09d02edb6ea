#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_grad_input: gx for dense, grouped and pointwise convolutions (ops::Conv2d), as an
// implicit GEMM per image and group (the transposed convolution, gathered, so every input
// element is written once and no atomics are needed):
//     GX[c][q] = Σ_(o,ky,kx) W[o][c][ky][kx] · G[o][(q + pad − (ky,kx)) / stride]
// c an input channel of the group (M = c_in/groups), q an input pixel (N = h·w); a term
// exists where q + pad − (ky, kx) is a multiple of the stride inside the output. G is the
// output gradient masked by y > 0 when the conv has a ReLU (the gradient at exactly 0 is 0).
//
// Grid: (⌈N/64⌉, ⌈M/32⌉, n·groups).

layout(std430, set = 0, binding = 0) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer GX { float gx[]; };

#include "conv_push.glsl"

uint img;
uint grp;
uint cig;
uint cog;
uint taps;

float load_a(uint c, uint r) {
    uint o = r / taps;
    uint t = r - o * taps;
    return wt[((grp * cog + o) * cig + c) * taps + t];
}

float load_b(uint r, uint q) {
    uint o = r / taps;
    uint t = r - o * taps;
    uint ky = t / pc.k;
    uint kx = t - ky * pc.k;
    uint iy = q / pc.w;
    uint ix = q - iy * pc.w;
    // Unsigned: a negative difference wraps to a huge value and fails the range test.
    uint sy = iy + pc.pad - ky;
    uint sx = ix + pc.pad - kx;
    uint oy = sy / pc.stride;
    uint ox = sx / pc.stride;
    if (oy * pc.stride != sy || ox * pc.stride != sx || oy >= pc.out_h || ox >= pc.out_w) {
        return 0.0;
    }
    uint idx = ((img * pc.c_out + grp * cog + o) * pc.out_h + oy) * pc.out_w + ox;
    float g = gy[idx];
    if (pc.relu != 0u && !(y[idx] > 0.0)) {
        g = 0.0;
    }
    return g;
}

#include "gemm.glsl"

void main() {
    img = gl_WorkGroupID.z / pc.groups;
    grp = gl_WorkGroupID.z % pc.groups;
    cig = pc.c_in / pc.groups;
    cog = pc.c_out / pc.groups;
    taps = pc.k * pc.k;
    uint plane = pc.h * pc.w;
    gemm_m = cig;
    gemm_n = plane;
    uint m0 = gl_WorkGroupID.y * GEMM_BM;
    uint n0 = gl_WorkGroupID.x * GEMM_BN;
    gemm_tile(m0, n0, 0u, cog * taps);
    for (uint i = 0u; i < 2u; i++) {
        uint m = m0 + gl_LocalInvocationID.y + 16u * i;
        if (m >= cig) {
            continue;
        }
        for (uint j = 0u; j < 4u; j++) {
            uint q = n0 + gl_LocalInvocationID.x + 16u * j;
            if (q < plane) {
                gx[(img * pc.c_in + grp * cig + m) * plane + q] = acc[i][j];
            }
        }
    }
}
