#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d: y = relu?(conv(x, w) + b) for dense and grouped convolutions (ops::Conv2d; 1×1
// convolutions take pointwise.comp), direct: no im2col buffer, no shared memory, no barrier.
// In det-s this is the stem (3 input channels: a GEMM's depth would be 27).
//
// One invocation per output pixel (of any image: pixels of the whole batch are numbered
// b·out_h·out_w + p), eight output channels per workgroup row. For each input channel and
// tap the invocation loads its one input value (neighbouring invocations read neighbouring
// pixels) and multiplies it into eight accumulators by weights that are the same for every
// invocation of the workgroup (uniform loads, broadcast from the cache). Padding is applied
// on the fly; bias and ReLU are fused into the store.
//
// Grid: (⌈n·out_h·out_w / 256⌉, ⌈(c_out/groups) / 8⌉, groups).

#define OCB 8u

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };

#include "conv_push.glsl"

void main() {
    uint grp = gl_WorkGroupID.z;
    uint cig = pc.c_in / pc.groups;
    uint cog = pc.c_out / pc.groups;
    uint taps = pc.k * pc.k;
    uint red = cig * taps;
    uint plane_in = pc.h * pc.w;
    uint plane_out = pc.out_h * pc.out_w;
    uint o0 = gl_WorkGroupID.y * OCB;
    // Output channels of this row that exist (uniform): rows past cog reuse the last one.
    uint rows = min(OCB, cog - o0);
    uint at = gl_GlobalInvocationID.x;
    if (at >= pc.n * plane_out) {
        return;
    }
    uint b = at / plane_out;
    uint p = at - b * plane_out;
    uint oy = p / pc.out_w;
    uint ox = p - oy * pc.out_w;
    int iy0 = int(oy * pc.stride) - int(pc.pad);
    int ix0 = int(ox * pc.stride) - int(pc.pad);
    uint x_base = (b * pc.c_in + grp * cig) * plane_in;
    uint w_base = (grp * cog + o0) * red;
    float acc[OCB];
    for (uint j = 0u; j < OCB; j++) {
        acc[j] = 0.0;
    }
    for (uint ci = 0u; ci < cig; ci++) {
        for (uint ky = 0u; ky < pc.k; ky++) {
            int iy = iy0 + int(ky);
            for (uint kx = 0u; kx < pc.k; kx++) {
                int ix = ix0 + int(kx);
                // A negative coordinate becomes a huge uint: one comparison per axis.
                float v = (uint(iy) < pc.h && uint(ix) < pc.w)
                    ? x[x_base + ci * plane_in + uint(iy) * pc.w + uint(ix)]
                    : 0.0;
                uint r = (ci * pc.k + ky) * pc.k + kx;
                for (uint j = 0u; j < OCB; j++) {
                    acc[j] += wt[w_base + min(j, rows - 1u) * red + r] * v;
                }
            }
        }
    }
    for (uint j = 0u; j < rows; j++) {
        uint o = grp * cog + o0 + j;
        float v = acc[j] + bias[o];
        if (pc.relu != 0u) {
            v = max(v, 0.0);
        }
        y[(b * pc.c_out + o) * plane_out + p] = v;
    }
}
