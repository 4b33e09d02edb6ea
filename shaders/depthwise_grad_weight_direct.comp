#version 450
// depthwise_grad_weight_direct: depthwise_grad_weight's sums (gw and gb of a depthwise conv:
// over the batch·pixel terms of a part, G[b][c][p] · X[b][c][tap t of p] for each tap t and
// G[b][c][p] alone for the bias; G the output gradient masked by y > 0 with a ReLU) for
// CPU-type devices (lavapipe). A workgroup takes one channel and every tap, so each gradient
// value is loaded once rather than once per tap, and adds its invocations' sums with one
// barrier rather than a tree of nine: on such a device a barrier switches between every lane
// group of the workgroup. Where whole blocks of PX outputs fill the rows (3×3, det-s's
// layers), a lane takes PX outputs of a row at a time and loads each input row's window once
// for all their taps (det-s's step at batch 32 on lavapipe: about 20 % less time than one
// output at a time, 10 % than four). Parts, the `partial` layout and conv2d_grad_reduce are
// those of depthwise_grad_weight.
//
// Grid: (c, 1, splits). 64 invocations; kernels up to 5×5 (MAX_TAPS).

#define LANES 64
#define MAX_TAPS 25
// Outputs of a row a lane takes at a time where whole blocks of them fill the rows.
#define PX 8u

layout(local_size_x = LANES) in;

// The inputs are read as uniform texel buffers (kernels.rs: KernelInfo::texels): on llvmpipe
// a texel fetch is one vector gather, where a storage-buffer load walks the lanes one by one.
layout(set = 0, binding = 0) uniform samplerBuffer x;
layout(set = 0, binding = 1) uniform samplerBuffer y;
layout(set = 0, binding = 2) uniform samplerBuffer gy;
layout(std430, set = 0, binding = 3) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 4) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

// sums[s][lane]: the tap sums, then the bias sum.
shared float sums[(MAX_TAPS + 1) * LANES];

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint c = gl_WorkGroupID.x;
    uint split = gl_WorkGroupID.z;
    uint taps = pc.k * pc.k;
    uint plane_out = pc.out_h * pc.out_w;
    uint total = pc.n * plane_out;
    uint begin = split * pc.chunk;
    uint end = min(total, begin + pc.chunk);
    float acc[MAX_TAPS];
    for (uint t = 0u; t < MAX_TAPS; t++) {
        acc[t] = 0.0;
    }
    float bias_sum = 0.0;
    if (pc.k == 3u && pc.stride <= 2u && pc.out_w % PX == 0u) {
        // Rows of whole blocks of PX outputs: a lane takes the blocks of its part in turn
        // (parts are whole multiples of 64 terms, lower.rs: DIRECT_SPLIT, so of PX) and loads
        // each input row's window once for the PX outputs' taps.
        for (uint e = begin + lane * PX; e < end; e += LANES * PX) {
            uint b = e / plane_out;
            uint p = e - b * plane_out;
            uint oy = p / pc.out_w;
            uint ox0 = p - oy * pc.out_w;
            uint idx = (b * pc.c_out + c) * plane_out + p;
            float g[PX];
            for (uint j = 0u; j < PX; j++) {
                g[j] = texelFetch(gy, int(idx + j)).x;
                if (pc.relu != 0u && !(texelFetch(y, int(idx + j)).x > 0.0)) {
                    g[j] = 0.0;
                }
                bias_sum += g[j];
            }
            uint x_base = (b * pc.c_in + c) * pc.h * pc.w;
            uint ix0 = ox0 * pc.stride - pc.pad; // wraps when negative
            uint span = pc.stride * (PX - 1u) + 3u;
            for (uint ky = 0u; ky < 3u; ky++) {
                uint iy = oy * pc.stride + ky - pc.pad;
                if (iy >= pc.h) {
                    continue;
                }
                uint xrow = x_base + iy * pc.w;
                float win[2u * PX + 1u];
                for (uint t = 0u; t < 2u * PX + 1u; t++) {
                    uint ix = ix0 + t;
                    win[t] = (ix < pc.w && t < span) ? texelFetch(x, int(xrow + ix)).x : 0.0;
                }
                for (uint kx = 0u; kx < 3u; kx++) {
                    for (uint j = 0u; j < PX; j++) {
                        acc[ky * 3u + kx] += g[j] * win[j * pc.stride + kx];
                    }
                }
            }
        }
    } else for (uint e = begin + lane; e < end; e += LANES) {
        uint b = e / plane_out;
        uint p = e - b * plane_out;
        uint oy = p / pc.out_w;
        uint ox = p - oy * pc.out_w;
        uint idx = (b * pc.c_out + c) * plane_out + p;
        float g = texelFetch(gy, int(idx)).x;
        if (pc.relu != 0u && !(texelFetch(y, int(idx)).x > 0.0)) {
            g = 0.0;
        }
        bias_sum += g;
        uint x_base = (b * pc.c_in + c) * pc.h * pc.w;
        int iy0 = int(oy * pc.stride) - int(pc.pad);
        int ix0 = int(ox * pc.stride) - int(pc.pad);
        for (uint ky = 0u; ky < pc.k; ky++) {
            int iy = iy0 + int(ky);
            for (uint kx = 0u; kx < pc.k; kx++) {
                int ix = ix0 + int(kx);
                float v = 0.0;
                if (uint(iy) < pc.h && uint(ix) < pc.w) {
                    v = texelFetch(x, int(x_base + uint(iy) * pc.w + uint(ix))).x;
                }
                acc[ky * pc.k + kx] += g * v;
            }
        }
    }
    for (uint t = 0u; t < taps; t++) {
        sums[t * LANES + lane] = acc[t];
    }
    sums[taps * LANES + lane] = bias_sum;
    barrier();
    if (lane > taps) {
        return;
    }
    float s = 0.0;
    for (uint l = 0u; l < LANES; l++) {
        s += sums[lane * LANES + l];
    }
    if (pc.splits > 1u) {
        partial[(split * pc.c_out + c) * (taps + 1u) + lane] = s;
    } else if (lane < taps) {
        gw[c * taps + lane] = s;
    } else {
        gb[c] = s;
    }
}
