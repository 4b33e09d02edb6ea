#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d: y = relu?(conv(x, w) + b) for dense, grouped and pointwise convolutions
// (ops::Conv2d), as an implicit GEMM per image and group:
//     Y[o][p] = Σ_r W[o][r] · X[r][p]
// o an output channel of the group (M = c_out/groups), p an output pixel (N = out_h·out_w),
// r = (input channel of the group, ky, kx) (K = c_in/groups·k·k). X is read straight from
// the input with the zero padding applied on the fly (no im2col buffer). Bias and ReLU are
// fused into the store.
//
// Grid: (⌈N/64⌉, ⌈M/32⌉, n·groups).

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };

#include "conv_push.glsl"
#include "gemm.glsl"

uint grp;       // group of this workgroup
uint cog;       // output channels per group
uint taps;      // k·k
uint red;       // K = c_in/groups · taps
uint x_base;    // first input element of this image and group
int col_iy;     // this invocation's output pixel, as the input row / column of tap (0, 0)
int col_ix;

// Per depth r: the input channel's offset and the tap.
shared uint tab_off[2][16];
shared int tab_ky[2][16];
shared int tab_kx[2][16];

void gemm_column(uint p) {
    uint oy = p / pc.out_w;
    uint ox = p - oy * pc.out_w;
    col_iy = int(oy * pc.stride) - int(pc.pad);
    col_ix = int(ox * pc.stride) - int(pc.pad);
}

void gemm_prepare(uint slot, uint i, uint r) {
    uint ci = r / taps;
    uint t = r - ci * taps;
    uint ky = t / pc.k;
    tab_off[slot][i] = ci * pc.h * pc.w;
    tab_ky[slot][i] = int(ky);
    tab_kx[slot][i] = int(t - ky * pc.k);
}

float load_a(uint m, uint kk, uint r) {
    return wt[(grp * cog + m) * red + r];
}

float load_b(uint kk, uint r) {
    int iy = col_iy + tab_ky[gemm_slot][kk];
    int ix = col_ix + tab_kx[gemm_slot][kk];
    // A negative coordinate becomes a huge uint: one comparison per axis.
    if (uint(iy) >= pc.h || uint(ix) >= pc.w) {
        return 0.0;
    }
    return x[x_base + tab_off[gemm_slot][kk] + uint(iy) * pc.w + uint(ix)];
}


void main() {
    uint img = gl_WorkGroupID.z / pc.groups;
    grp = gl_WorkGroupID.z % pc.groups;
    uint cig = pc.c_in / pc.groups;
    cog = pc.c_out / pc.groups;
    taps = pc.k * pc.k;
    red = cig * taps;
    x_base = (img * pc.c_in + grp * cig) * pc.h * pc.w;
    uint plane_out = pc.out_h * pc.out_w;
    gemm_m = cog;
    gemm_n = plane_out;
    uint m0 = gl_WorkGroupID.y * GEMM_BM;
    uint n0 = gl_WorkGroupID.x * GEMM_BN;
    gemm_tile(m0, n0, 0u, red);
    for (uint i = 0u; i < 2u; i++) {
        uint m = m0 + gl_LocalInvocationID.y + 16u * i;
        if (m >= cog) {
            continue;
        }
        uint o = grp * cog + m;
        float b = bias[o];
        for (uint j = 0u; j < 4u; j++) {
            uint p = n0 + gl_LocalInvocationID.x + 16u * j;
            if (p < plane_out) {
                float v = acc[i][j] + b;
                if (pc.relu != 0u) {
                    v = max(v, 0.0);
                }
                y[(img * pc.c_out + o) * plane_out + p] = v;
            }
        }
    }
}
