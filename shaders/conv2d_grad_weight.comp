#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_grad_weight: gw and gb of dense, grouped and pointwise convolutions (ops::Conv2d),
// as an implicit GEMM per group over the batch and the output pixels:
//     GW[o][r] = Σ_(b,p) G[b][o][p] · X[b][r][p]      r = (input channel, ky, kx) < R
//     GB[o]    = Σ_(b,p) G[b][o][p]                   the column r = R, where X is 1
// (M = c_out/groups, N = R + 1, K = n·out_h·out_w). G is the output gradient masked by y > 0
// with a ReLU. The K sum is split into `splits` parts of `chunk` terms (a workgroup each),
// so small weight tensors still spread over the device; each part writes its own slice of
// `partial` ([split][c_out][R + 1]) and conv2d_grad_reduce adds them in a fixed order:
// deterministic, no float atomics. With one part the results go straight to gw and gb.
//
// Grid: (⌈(R+1)/64⌉, ⌈M/32⌉, groups·splits).

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 4) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

uint grp;
uint cig;
uint cog;
uint taps;
uint red;       // R
uint plane_out;

float load_a(uint m, uint kb) {
    uint b = kb / plane_out;
    uint p = kb - b * plane_out;
    uint idx = (b * pc.c_out + grp * cog + m) * plane_out + p;
    float g = gy[idx];
    if (pc.relu != 0u && !(y[idx] > 0.0)) {
        g = 0.0;
    }
    return g;
}

float load_b(uint kb, uint r) {
    if (r == red) {
        return 1.0;
    }
    uint b = kb / plane_out;
    uint p = kb - b * plane_out;
    uint ci = r / taps;
    uint t = r - ci * taps;
    uint ky = t / pc.k;
    uint kx = t - ky * pc.k;
    uint oy = p / pc.out_w;
    uint ox = p - oy * pc.out_w;
    uint iy = oy * pc.stride + ky - pc.pad;
    uint ix = ox * pc.stride + kx - pc.pad;
    if (iy >= pc.h || ix >= pc.w) {
        return 0.0;
    }
    return x[((b * pc.c_in + grp * cig + ci) * pc.h + iy) * pc.w + ix];
}

#include "gemm.glsl"

void main() {
    grp = gl_WorkGroupID.z % pc.groups;
    uint split = gl_WorkGroupID.z / pc.groups;
    cig = pc.c_in / pc.groups;
    cog = pc.c_out / pc.groups;
    taps = pc.k * pc.k;
    red = cig * taps;
    plane_out = pc.out_h * pc.out_w;
    gemm_m = cog;
    gemm_n = red + 1u;
    uint total = pc.n * plane_out;
    uint k_begin = split * pc.chunk;
    uint k_end = min(total, k_begin + pc.chunk);
    uint m0 = gl_WorkGroupID.y * GEMM_BM;
    uint n0 = gl_WorkGroupID.x * GEMM_BN;
    gemm_tile(m0, n0, k_begin, k_end);
    uint row = red + 1u;
    for (uint i = 0u; i < 2u; i++) {
        uint m = m0 + gl_LocalInvocationID.y + 16u * i;
        if (m >= cog) {
            continue;
        }
        uint o = grp * cog + m;
        for (uint j = 0u; j < 4u; j++) {
            uint r = n0 + gl_LocalInvocationID.x + 16u * j;
            if (r > red) {
                continue;
            }
            if (pc.splits > 1u) {
                partial[(split * pc.c_out + o) * row + r] = acc[i][j];
            } else if (r < red) {
                gw[o * red + r] = acc[i][j];
            } else {
                gb[o] = acc[i][j];
            }
        }
    }
}
