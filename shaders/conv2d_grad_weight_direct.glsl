// The part of conv2d_grad_weight_direct.comp and conv2d_grad_weight_direct4.comp that does
// not depend on how the terms are read: the tile, the bindings, and the end of a workgroup,
// where its 64 lanes' register blocks are added in lane order through shared memory
// (deterministic, no float atomics) and stored as partial sums or as gw and gb.

// The includer defines the tile: TM output channels × TN weight columns.
#define LANES 64
// The TM·TN weight sums, then the TM bias sums.
#define SUMS (TM * TN + TM)
// Sums added through shared memory at a time (one each for the first CHUNK lanes), which
// keeps it within 16 KiB whatever the tile.
#define CHUNK 48

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

// sums[c][lane]: lane's sum s0 + c, read back in lane order.
shared float sums[CHUNK * LANES];

// Stores the workgroup's sum number s (s < SUMS; output channel m0 + s / TN, weight column
// n0 + s % TN, or for s ≥ TM·TN the bias of channel m0 + s − TM·TN) for part `split`.
void store_sum(float total, uint s, uint grp, uint split, uint red, uint m0, uint n0) {
    uint cog = pc.c_out / pc.groups;
    bool is_bias = s >= TM * TN;
    uint i = is_bias ? s - TM * TN : s / TN;
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
            partial[(split * pc.c_out + o) * row + red] = total;
        } else {
            gb[o] = total;
        }
        return;
    }
    uint r = n0 + s % TN;
    if (r >= red) {
        return;
    }
    if (pc.splits > 1u) {
        partial[(split * pc.c_out + o) * row + r] = total;
    } else {
        gw[o * red + r] = total;
    }
}

// Adds sums s0 .. s0 + CHUNK of the lanes' blocks in lane order and stores them. s0 is a
// literal at each call, so that every index into acc is a constant once the loops unroll
// (an index the compiler cannot fold would put acc in memory for the whole kernel).
void store_chunk(uint s0, float acc[TM][TN], float bias_sum[TM], uint lane, uint grp,
                 uint split, uint red, uint m0, uint n0) {
    // Loops over the tile, not the chunk: the compiler unrolls loops this short only.
    for (uint i = 0u; i < TM; i++) {
        for (uint j = 0u; j < TN; j++) {
            uint s = i * TN + j;
            if (s >= s0 && s < s0 + CHUNK) {
                sums[(s - s0) * LANES + lane] = acc[i][j];
            }
        }
        uint s = TM * TN + i;
        if (s >= s0 && s < s0 + CHUNK) {
            sums[(s - s0) * LANES + lane] = bias_sum[i];
        }
    }
    barrier();
    if (lane < CHUNK && s0 + lane < SUMS) {
        float total = 0.0;
        for (uint l = 0u; l < LANES; l++) {
            total += sums[lane * LANES + l];
        }
        store_sum(total, s0 + lane, grp, split, red, m0, n0);
    }
    // Before the next chunk overwrites sums; after the last one, none (on llvmpipe a barrier
    // switches between every lane group of the workgroup).
    if (s0 + CHUNK < SUMS) {
        barrier();
    }
}

// Adds the lanes' blocks (output channels m0 .. m0 + TM of group grp, weight columns
// n0 .. n0 + TN of the red per channel) in lane order, CHUNK sums at a time, and stores the
// workgroup's sums for part `split`. Every lane of the workgroup calls it (it holds barriers).
void store_sums(float acc[TM][TN], float bias_sum[TM], uint lane, uint grp, uint split,
                uint red, uint m0, uint n0) {
    store_chunk(0u, acc, bias_sum, lane, grp, split, red, m0, n0);
#if SUMS > 1 * CHUNK
    store_chunk(1u * CHUNK, acc, bias_sum, lane, grp, split, red, m0, n0);
#endif
#if SUMS > 2 * CHUNK
    store_chunk(2u * CHUNK, acc, bias_sum, lane, grp, split, red, m0, n0);
#endif
#if SUMS > 3 * CHUNK
    store_chunk(3u * CHUNK, acc, bias_sum, lane, grp, split, red, m0, n0);
#endif
#if SUMS > 4 * CHUNK
#error "a tile of more than 4 · CHUNK sums"
#endif
}
