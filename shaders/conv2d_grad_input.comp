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
// Grid: (⌈N/GEMM_BN⌉, ⌈M/GEMM_BM⌉, n·groups).

layout(std430, set = 0, binding = 0) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer GX { float gx[]; };

#include "conv_push.glsl"
#include "gemm.glsl"

uint grp;
uint cig;
uint cog;
uint taps;
uint g_base;    // first output-gradient element of this image and group
int col_sy;     // this invocation's input pixel plus the padding
int col_sx;

// Per depth (o, ky, kx): the weight offset, the output channel's offset and the tap.
shared uint tab_w[2][16];
shared uint tab_g[2][16];
shared int tab_ky[2][16];
shared int tab_kx[2][16];

void gemm_column(uint q) {
    uint iy = q / pc.w;
    col_sy = int(iy + pc.pad);
    col_sx = int(q - iy * pc.w + pc.pad);
}

void gemm_prepare(uint slot, uint i, uint r) {
    uint o = r / taps;
    uint t = r - o * taps;
    uint ky = t / pc.k;
    tab_w[slot][i] = (grp * cog + o) * cig * taps + t;
    tab_g[slot][i] = o * pc.out_h * pc.out_w;
    tab_ky[slot][i] = int(ky);
    tab_kx[slot][i] = int(t - ky * pc.k);
}

float load_a(uint c, uint kk, uint r) {
    return wt[tab_w[gemm_slot][kk] + c * taps];
}

// s / stride where s ≥ 0 is a multiple of the stride, else a value ≥ limit (no term).
uint on_grid(int s, uint limit) {
    if (s < 0) {
        return limit;
    }
    uint u = uint(s);
    if (pc.stride == 1u) {
        return u;
    }
    if (pc.stride == 2u) {
        return (u & 1u) == 0u ? u >> 1 : limit;
    }
    uint d = u / pc.stride;
    return d * pc.stride == u ? d : limit;
}

float load_b(uint kk, uint r) {
    uint oy = on_grid(col_sy - tab_ky[gemm_slot][kk], pc.out_h);
    uint ox = on_grid(col_sx - tab_kx[gemm_slot][kk], pc.out_w);
    if (oy >= pc.out_h || ox >= pc.out_w) {
        return 0.0;
    }
    uint idx = g_base + tab_g[gemm_slot][kk] + oy * pc.out_w + ox;
    float g = gy[idx];
    if (pc.relu != 0u && !(y[idx] > 0.0)) {
        g = 0.0;
    }
    return g;
}


void main() {
    uint img = gl_WorkGroupID.z / pc.groups;
    grp = gl_WorkGroupID.z % pc.groups;
    cig = pc.c_in / pc.groups;
    cog = pc.c_out / pc.groups;
    taps = pc.k * pc.k;
    g_base = (img * pc.c_out + grp * cog) * pc.out_h * pc.out_w;
    uint plane = pc.h * pc.w;
    gemm_m = cig;
    gemm_n = plane;
    uint m0 = gl_WorkGroupID.y * GEMM_BM;
    uint n0 = gl_WorkGroupID.x * GEMM_BN;
    gemm_tile(m0, n0, 0u, cog * taps);
    for (uint i = 0u; i < GEMM_TM; i++) {
        uint m = m0 + gl_LocalInvocationID.y + 16u * i;
        if (m >= cig) {
            continue;
        }
        for (uint j = 0u; j < GEMM_TN; j++) {
            uint q = n0 + gl_LocalInvocationID.x + 16u * j;
            if (q < plane) {
                gx[(img * pc.c_in + grp * cig + m) * plane + q] = acc[i][j];
            }
        }
    }
}
