#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_grad_reduce: adds the `splits` partial weight and bias gradients that
// conv2d_grad_weight / depthwise_grad_weight wrote ([split][c_out][R + 1], R =
// c_in/groups·k·k, column R the bias) into gw and gb.
//
// A workgroup takes 32 consecutive sums (x: reads of a split's row stay contiguous) and
// has 8 lanes (y) share the splits: lane y adds splits y, y + 8, y + 16, … in turn, then
// lane 0 adds the eight lanes' sums in lane order. The order is fixed by the split count
// alone, whatever the grid: deterministic, no atomics. One invocation summing every split
// (conv2d_grad_reduce_direct) leaves a GPU with a few workgroups each walking hundreds of
// splits. A grid-stride loop over blocks of 32 covers any grid.

layout(local_size_x = 32, local_size_y = 8) in;

layout(std430, set = 0, binding = 0) readonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 1) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 2) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

const uint BLOCK = 32u;
const uint LANES = 8u;

shared float lane_sums[LANES][BLOCK];

void main() {
    uint red = pc.c_in / pc.groups * pc.k * pc.k;
    uint row = red + 1u;
    uint len = pc.c_out * row;
    uint x = gl_LocalInvocationID.x;
    uint y = gl_LocalInvocationID.y;
    // The loop bound is the same for the whole workgroup, so every barrier is reached by all.
    for (uint base = gl_WorkGroupID.x * BLOCK; base < len; base += gl_NumWorkGroups.x * BLOCK) {
        uint i = base + x;
        float s = 0.0;
        if (i < len) {
            for (uint sp = y; sp < pc.splits; sp += LANES) {
                s += partial[sp * len + i];
            }
        }
        lane_sums[y][x] = s;
        barrier();
        if (y == 0u && i < len) {
            float t = lane_sums[0][x];
            for (uint l = 1u; l < LANES; l++) {
                t += lane_sums[l][x];
            }
            uint o = i / row;
            uint r = i - o * row;
            if (r < red) {
                gw[o * red + r] = t;
            } else {
                gb[o] = t;
            }
        }
        barrier();
    }
}
