#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_grad_reduce_direct: conv2d_grad_reduce for CPU-type devices, with no shared memory
// or barrier. Adds the `splits` partial weight and bias gradients ([split][c_out][R + 1], R =
// c_in/groups·k·k, column R the bias) into gw and gb, in split order: deterministic. One
// invocation per (o, r), summing every split in turn; a grid-stride loop covers any grid.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

// The inputs are read as uniform texel buffers (kernels.rs: KernelInfo::texels): on llvmpipe
// a texel fetch is one vector gather, where a storage-buffer load walks the lanes one by one.
layout(set = 0, binding = 0) uniform samplerBuffer partial;
layout(std430, set = 0, binding = 1) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 2) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

void main() {
    uint red = pc.c_in / pc.groups * pc.k * pc.k;
    uint row = red + 1u;
    uint len = pc.c_out * row;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        float s = 0.0;
        for (uint sp = 0u; sp < pc.splits; sp++) {
            s += texelFetch(partial, int(sp * len + i)).x;
        }
        uint o = i / row;
        uint r = i - o * row;
        if (r < red) {
            gw[o * red + r] = s;
        } else {
            gb[o] = s;
        }
    }
}
