#version 450
// conv2d_grad_weight_direct4: conv2d_grad_weight_direct for pointwise convs (1×1, stride 1,
// no padding, one group) whose plane is a multiple of four, reading four terms (pixels) at a
// time: the inputs are uniform texel buffers of vec4s (kernels.rs: TexelFormat::F32x4), so
// each fetch, one vector gather on llvmpipe, brings four terms where the scalar kernel's
// brings one. The same bindings, push block, grid, parts and tile; a lane takes the
// four-term groups of its part in turn and adds each group's four products in order.
//
// Grid: (⌈c_in/TN⌉, ⌈c_out/TM⌉, splits).

#define TM 4
#define TN 8
#define LANES 64
// The TM·TN weight sums, then the TM bias sums.
#define SUMS (TM * TN + TM)

layout(local_size_x = LANES, local_size_y = 1, local_size_z = 1) in;

layout(set = 0, binding = 0) uniform samplerBuffer x;
layout(set = 0, binding = 1) uniform samplerBuffer y;
layout(set = 0, binding = 2) uniform samplerBuffer gy;
layout(std430, set = 0, binding = 3) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 4) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

// sums[s][lane]: lane's sum s, read back in lane order.
shared float sums[SUMS * LANES];

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

    for (uint i = 0u; i < TM; i++) {
        for (uint j = 0u; j < TN; j++) {
            sums[(i * TN + j) * LANES + lane] = acc[i][j];
        }
        sums[(TM * TN + i) * LANES + lane] = bias_sum[i];
    }
    barrier();
    if (lane >= SUMS) {
        return;
    }
    float s = 0.0;
    for (uint l = 0u; l < LANES; l++) {
        s += sums[lane * LANES + l];
    }
    bool is_bias = lane >= TM * TN;
    uint i = is_bias ? lane - TM * TN : lane / TN;
    uint m = m0 + i;
    if (m >= pc.c_out) {
        return;
    }
    uint o = m;
    uint row = red + 1u;
    if (is_bias) {
        // The bias, once per row: by the first column tile.
        if (gl_WorkGroupID.x != 0u) {
            return;
        }
        if (pc.splits > 1u) {
            partial[(split * pc.c_out + o) * row + red] = s;
        } else {
            gb[o] = s;
        }
        return;
    }
    uint r = n0 + lane % TN;
    if (r >= red) {
        return;
    }
    if (pc.splits > 1u) {
        partial[(split * pc.c_out + o) * row + r] = s;
    } else {
        gw[o * red + r] = s;
    }
}
