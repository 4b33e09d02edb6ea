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

uint img;       // image of this workgroup
uint grp;       // group of this workgroup
uint cig;       // input channels per group
uint cog;       // output channels per group
uint taps;      // k·k
uint red;       // K = cig·taps
uint plane_out; // out_h·out_w

float load_a(uint m, uint r) {
    return wt[(grp * cog + m) * red + r];
}

float load_b(uint r, uint p) {
    uint ci = r / taps;
    uint t = r - ci * taps;
    uint ky = t / pc.k;
    uint kx = t - ky * pc.k;
    uint oy = p / pc.out_w;
    uint ox = p - oy * pc.out_w;
    // Unsigned wrap-around makes a negative coordinate huge: one comparison per axis.
    uint iy = oy * pc.stride + ky - pc.pad;
    uint ix = ox * pc.stride + kx - pc.pad;
    if (iy >= pc.h || ix >= pc.w) {
        return 0.0;
    }
    return x[((img * pc.c_in + grp * cig + ci) * pc.h + iy) * pc.w + ix];
}

#include "gemm.glsl"

void main() {
    img = gl_WorkGroupID.z / pc.groups;
    grp = gl_WorkGroupID.z % pc.groups;
    cig = pc.c_in / pc.groups;
    cog = pc.c_out / pc.groups;
    taps = pc.k * pc.k;
    red = cig * taps;
    plane_out = pc.out_h * pc.out_w;
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
