#version 450
// depthwise_grad_weight_direct: depthwise_grad_weight's sums (gw and gb of a depthwise conv:
// over the batch·pixel terms of a part, G[b][c][p] · texelFetch(x, int(b)).x[c][tap t of p] for each tap t and
// G[b][c][p] alone for the bias; G the output gradient masked by y > 0 with a ReLU) for
// CPU-type devices (lavapipe). A workgroup takes one channel and every tap, so each gradient
// value is loaded once rather than once per tap, and adds its invocations' sums with one
// barrier rather than a tree of nine: on such a device a barrier switches between every lane
// group of the workgroup. Parts, the `partial` layout and conv2d_grad_reduce are those of
// depthwise_grad_weight.
//
// Grid: (c, 1, splits). 64 invocations; kernels up to 5×5 (MAX_TAPS).

#define LANES 64
#define MAX_TAPS 25

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
    for (uint e = begin + lane; e < end; e += LANES) {
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
