#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_grad_weight: gw and gb of dense, grouped and pointwise convolutions (ops::Conv2d),
// as an implicit GEMM per group over the batch and the output pixels:
//     GW[o][r] = Σ_(b,p) G[b][o][p] · X[b][r][p]      r = (input channel, ky, kx) < R
//     GB[o]    = Σ_(b,p) G[b][o][p]                   (row sums of the same A tiles)
// (M = c_out/groups, N = R, K = n·out_h·out_w). G is the output gradient masked by y > 0
// with a ReLU. The K sum is split into `splits` parts of `chunk` terms (a workgroup each),
// so small weight tensors still spread over the device; each part writes its own slice of
// `partial` ([split][c_out][R + 1], column R the bias) and conv2d_grad_reduce adds them in a
// fixed order: deterministic, no float atomics. With one part the results go straight to gw
// and gb.
//
// Grid: (⌈R/GEMM_BN⌉, ⌈M/GEMM_BM⌉, groups·splits).

#define GEMM_ROW_SUMS

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 4) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"
#include "gemm.glsl"

uint grp;
uint cig;
uint cog;
uint taps;
uint plane_out;
uint col_off;   // this invocation's r: input channel offset (in the group) and tap
int col_ky;
int col_kx;

// Per depth (b, p): the gradient and input offsets of image b, and pixel p's tap (0, 0).
shared uint tab_g[2][16];
shared uint tab_x[2][16];
shared int tab_iy[2][16];
shared int tab_ix[2][16];

void gemm_column(uint r) {
    uint ci = r / taps;
    uint t = r - ci * taps;
    uint ky = t / pc.k;
    col_off = (grp * cig + ci) * pc.h * pc.w;
    col_ky = int(ky);
    col_kx = int(t - ky * pc.k);
}

void gemm_prepare(uint slot, uint i, uint kb) {
    uint b = kb / plane_out;
    uint p = kb - b * plane_out;
    uint oy = p / pc.out_w;
    uint ox = p - oy * pc.out_w;
    tab_g[slot][i] = (b * pc.c_out + grp * cog) * plane_out + p;
    tab_x[slot][i] = b * pc.c_in * pc.h * pc.w;
    tab_iy[slot][i] = int(oy * pc.stride) - int(pc.pad);
    tab_ix[slot][i] = int(ox * pc.stride) - int(pc.pad);
}

float load_a(uint m, uint kk, uint kb) {
    uint idx = tab_g[gemm_slot][kk] + m * plane_out;
    float g = gy[idx];
    if (pc.relu != 0u && !(y[idx] > 0.0)) {
        g = 0.0;
    }
    return g;
}

float load_b(uint kk, uint kb) {
    int iy = tab_iy[gemm_slot][kk] + col_ky;
    int ix = tab_ix[gemm_slot][kk] + col_kx;
    if (uint(iy) >= pc.h || uint(ix) >= pc.w) {
        return 0.0;
    }
    return x[tab_x[gemm_slot][kk] + col_off + uint(iy) * pc.w + uint(ix)];
}


void main() {
    grp = gl_WorkGroupID.z % pc.groups;
    uint split = gl_WorkGroupID.z / pc.groups;
    cig = pc.c_in / pc.groups;
    cog = pc.c_out / pc.groups;
    taps = pc.k * pc.k;
    uint red = cig * taps;
    plane_out = pc.out_h * pc.out_w;
    gemm_m = cog;
    gemm_n = red;
    uint total = pc.n * plane_out;
    uint k_begin = split * pc.chunk;
    uint k_end = min(total, k_begin + pc.chunk);
    uint m0 = gl_WorkGroupID.y * GEMM_BM;
    uint n0 = gl_WorkGroupID.x * GEMM_BN;
    gemm_tile(m0, n0, k_begin, k_end);
    uint row = red + 1u;
    for (uint i = 0u; i < GEMM_TM; i++) {
        uint m = m0 + gl_LocalInvocationID.y + 16u * i;
        if (m >= cog) {
            continue;
        }
        uint o = grp * cog + m;
        for (uint j = 0u; j < GEMM_TN; j++) {
            uint r = n0 + gl_LocalInvocationID.x + 16u * j;
            if (r >= red) {
                continue;
            }
            if (pc.splits > 1u) {
                partial[(split * pc.c_out + o) * row + r] = acc[i][j];
            } else {
                gw[o * red + r] = acc[i][j];
            }
        }
        // The bias, once per row: by the first column tile's first column of invocations.
        if (gl_WorkGroupID.x == 0u && gl_LocalInvocationID.x == 0u) {
            if (pc.splits > 1u) {
                partial[(split * pc.c_out + o) * row + red] = row_sum[i];
            } else {
                gb[o] = row_sum[i];
            }
        }
    }
}
