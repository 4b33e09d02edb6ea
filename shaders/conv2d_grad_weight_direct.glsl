// The part of conv2d_grad_weight_direct.comp and conv2d_grad_weight_direct4.comp that does
// not depend on how the terms are read: the tile, the bindings, and the end of a workgroup,
// where its 64 lanes' register blocks are added in lane order through shared memory
// (deterministic, no float atomics) and stored as partial sums or as gw and gb.

#define TM 4
#define TN 8
#define LANES 64
// The TM·TN weight sums, then the TM bias sums.
#define SUMS (TM * TN + TM)

layout(local_size_x = LANES, local_size_y = 1, local_size_z = 1) in;

// The inputs are read as uniform texel buffers (kernels.rs: KernelInfo::texels): on llvmpipe
// a texel fetch is one vector gather, where a storage-buffer load walks the lanes one by one.
layout(set = 0, binding = 0) uniform samplerBuffer x;
layout(set = 0, binding = 1) uniform samplerBuffer y;
layout(set = 0, binding = 2) uniform samplerBuffer gy;
layout(std430, set = 0, binding = 3) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 4) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

// sums[s][lane]: lane's sum s, read back in lane order.
shared float sums[SUMS * LANES];

// Adds the lanes' blocks (output channels m0 .. m0 + TM of group grp, weight columns
// n0 .. n0 + TN of the red per channel) and stores the workgroup's sums for part `split`.
// Every lane of the workgroup calls it (it holds a barrier).
void store_sums(float acc[TM][TN], float bias_sum[TM], uint lane, uint grp, uint split,
                uint red, uint m0, uint n0) {
    uint cog = pc.c_out / pc.groups;
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
    if (m >= cog) {
        return;
    }
    uint o = grp * cog + m;
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
