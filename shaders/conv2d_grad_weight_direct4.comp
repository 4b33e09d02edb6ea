#version 450
// conv2d_grad_weight_direct4: conv2d_grad_weight_direct for pointwise convs (1×1, stride 1,
// no padding, one group) whose plane is a multiple of four, reading four terms (pixels) at a
// time: the inputs are uniform texel buffers of vec4s (kernels.rs: TexelFormat::F32x4), so
// each fetch, one vector gather on llvmpipe, brings four terms where the scalar kernel's
// brings one. The same bindings, push block, grid and parts, with a tile of 8 × 16; a lane
// takes the four-term groups of its part in turn and adds each group's four products in
// order.
//
// Grid: (⌈c_in/TN⌉, ⌈c_out/TM⌉, splits).

#define TM 8
#define TN 16
#include "conv2d_grad_weight_direct.glsl"

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint split = gl_WorkGroupID.z;
    uint red = pc.c_in;
    uint quads = pc.h * pc.w / 4u;
    // Parts are whole multiples of 64 terms (lower.rs: DIRECT_SPLIT), so of four.
    uint q_begin = split * pc.chunk / 4u;
    uint q_end = min(pc.n * quads, q_begin + pc.chunk / 4u);
    uint m0 = gl_WorkGroupID.y * TM;
    uint n0 = gl_WorkGroupID.x * TN;

    // Rows and columns past the edge read a valid one (clamped) and are not stored, so the
    // loop has no branch on them.
    uint g_row[TM];
    for (uint i = 0u; i < TM; i++) {
        g_row[i] = min(m0 + i, pc.c_out - 1u) * quads;
    }
    uint col[TN];
    for (uint j = 0u; j < TN; j++) {
        col[j] = min(n0 + j, red - 1u) * quads;
    }

    float acc[TM][TN];
    float bias_sum[TM];
    for (uint i = 0u; i < TM; i++) {
        bias_sum[i] = 0.0;
        for (uint j = 0u; j < TN; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint kq = q_begin + lane; kq < q_end; kq += LANES) {
        uint b = kq / quads;
        uint p = kq - b * quads;
        uint g_base = b * pc.c_out * quads + p;
        vec4 g[TM];
        for (uint i = 0u; i < TM; i++) {
            int idx = int(g_base + g_row[i]);
            g[i] = texelFetch(gy, idx);
            if (pc.relu != 0u) {
                g[i] = mix(vec4(0.0), g[i], greaterThan(texelFetch(y, idx), vec4(0.0)));
            }
            bias_sum[i] += ((g[i].x + g[i].y) + g[i].z) + g[i].w;
        }
        uint x_base = b * pc.c_in * quads + p;
        for (uint j = 0u; j < TN; j++) {
            vec4 v = texelFetch(x, int(x_base + col[j]));
            for (uint i = 0u; i < TM; i++) {
                vec4 t = g[i] * v;
                acc[i][j] += ((t.x + t.y) + t.z) + t.w;
            }
        }
    }

    store_sums(acc, bias_sum, lane, 0u, split, red, m0, n0);
}
