#version 450
// conv2d_grad_weight_direct: conv2d_grad_weight's sums (gw and gb of dense, grouped and
// pointwise convolutions; G the output gradient, masked by y > 0 with a ReLU)
//     GW[o][r] = Σ_(b,p) G[b][o][p] · X[b][r][p]      r = (input channel, ky, kx)
//     GB[o]    = Σ_(b,p) G[b][o][p]
// for CPU-type devices (lavapipe): no shared-memory tiles and one barrier per workgroup
// rather than two per 16 terms. Such a device runs a workgroup's invocations a SIMD vector
// at a time and switches between all of them at every barrier; there the tiled kernel spent
// most of det-s's training step (3.5 s of 8.4 s at batch 32 on 2 cores).
//
// The 64 invocations of a workgroup take the terms k of its part in turn (k = k_begin + t,
// + 64, ...): neighbouring invocations read neighbouring pixels, which a CPU loads as one
// vector. Each sums a TM × TN block of outputs (16 output channels × 9 columns r, one input
// channel's 3×3 taps, and the 16 bias sums) over its terms, in registers; at the end the 64
// blocks are added in a fixed order through shared memory: deterministic, no float atomics.
// Each term's fetches serve TM·TN products: at 4 × 8, det-s's stem gradient (27 columns, 16
// channels) took twice as long on lavapipe (8 × 9: 1.4×; 8 × 27 and 16 × 27 no faster than
// 16 × 9). Parts, the `partial` layout and conv2d_grad_reduce are those of conv2d_grad_weight.
//
// Grid: (⌈R/TN⌉, ⌈M/TM⌉, groups·splits), M = c_out/groups, R = c_in/groups·k².

#define TM 16
#define TN 9
#include "conv2d_grad_weight_direct.glsl"

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint grp = gl_WorkGroupID.z % pc.groups;
    uint split = gl_WorkGroupID.z / pc.groups;
    uint cig = pc.c_in / pc.groups;
    uint cog = pc.c_out / pc.groups;
    uint taps = pc.k * pc.k;
    uint red = cig * taps;
    uint plane_out = pc.out_h * pc.out_w;
    uint plane_in = pc.h * pc.w;
    uint total = pc.n * plane_out;
    uint k_begin = split * pc.chunk;
    uint k_end = min(total, k_begin + pc.chunk);
    uint m0 = gl_WorkGroupID.y * TM;
    uint n0 = gl_WorkGroupID.x * TN;

    // Rows and columns past the edge read a valid one (clamped) and are not stored, so the
    // loop has no branch on them.
    uint g_row[TM];
    for (uint i = 0u; i < TM; i++) {
        g_row[i] = (grp * cog + min(m0 + i, cog - 1u)) * plane_out;
    }
    uint col_off[TN];
    int col_ky[TN];
    int col_kx[TN];
    for (uint j = 0u; j < TN; j++) {
        uint r = min(n0 + j, red - 1u);
        uint ci = r / taps;
        uint t = r - ci * taps;
        uint ky = t / pc.k;
        col_off[j] = (grp * cig + ci) * plane_in;
        col_ky[j] = int(ky);
        col_kx[j] = int(t - ky * pc.k);
    }

    float acc[TM][TN];
    float bias_sum[TM];
    for (uint i = 0u; i < TM; i++) {
        bias_sum[i] = 0.0;
        for (uint j = 0u; j < TN; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint kb = k_begin + lane; kb < k_end; kb += LANES) {
        uint b = kb / plane_out;
        uint p = kb - b * plane_out;
        uint oy = p / pc.out_w;
        uint ox = p - oy * pc.out_w;
        uint g_base = b * pc.c_out * plane_out + p;
        float g[TM];
        for (uint i = 0u; i < TM; i++) {
            uint idx = g_base + g_row[i];
            g[i] = texelFetch(gy, int(idx)).x;
            if (pc.relu != 0u && !(texelFetch(y, int(idx)).x > 0.0)) {
                g[i] = 0.0;
            }
            bias_sum[i] += g[i];
        }
        uint x_base = b * pc.c_in * plane_in;
        int iy0 = int(oy * pc.stride) - int(pc.pad);
        int ix0 = int(ox * pc.stride) - int(pc.pad);
        for (uint j = 0u; j < TN; j++) {
            int iy = iy0 + col_ky[j];
            int ix = ix0 + col_kx[j];
            float v = 0.0;
            if (uint(iy) < pc.h && uint(ix) < pc.w) {
                v = texelFetch(x, int(x_base + col_off[j] + uint(iy) * pc.w + uint(ix))).x;
            }
            for (uint i = 0u; i < TM; i++) {
                acc[i][j] += g[i] * v;
            }
        }
    }

    store_sums(acc, bias_sum, lane, grp, split, red, m0, n0);
}
