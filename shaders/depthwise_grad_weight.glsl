// depthwise_grad_weight: gw and gb of a depthwise convolution (ops::Conv2d). Workgroup
// (c, t, split) sums, over its part of the batch·pixel terms, G[b][c][p] · x[b][c][tap t of p]
// (t < k·k) or G[b][c][p] alone (t = k·k: the bias), G the output gradient masked by y > 0
// with a ReLU. Each invocation sums a strided subset, then workgroup_sum.glsl adds the 256
// partial sums in a fixed order (deterministic, no atomics). With several splits the part
// goes to `partial` ([split][c][k·k + 1]) for conv2d_grad_reduce, else straight to gw / gb.
//
// Grid: (c, k·k + 1, splits). 256 invocations, 1 KiB of shared memory.
// depthwise_grad_weight_subgroup.comp is the same with SUBGROUPS defined.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 4) writeonly buffer GW { float gw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer GB { float gb[]; };

#include "conv_push.glsl"

#define WG_SIZE 256u
#include "workgroup_sum.glsl"

void main() {
    uint c = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint split = gl_WorkGroupID.z;
    uint taps = pc.k * pc.k;
    uint ky = t / pc.k;
    uint kx = t - ky * pc.k;
    uint plane_out = pc.out_h * pc.out_w;
    uint total = pc.n * plane_out;
    uint begin = split * pc.chunk;
    uint end = min(total, begin + pc.chunk);
    // Term e = begin + tid + 256·j is (image b, output pixel (oy, ox)); the coordinates
    // advance by 256 terms per iteration without a division (slow on GPUs, worse on CPU
    // SIMD): 256 = d_b·plane_out + d_y·out_w + d_x.
    uint e = begin + gl_LocalInvocationID.x;
    uint b = e / plane_out;
    uint p = e - b * plane_out;
    uint oy = p / pc.out_w;
    uint ox = p - oy * pc.out_w;
    uint d_b = 256u / plane_out;
    uint d_p = 256u - d_b * plane_out;
    uint d_y = d_p / pc.out_w;
    uint d_x = d_p - d_y * pc.out_w;
    float s = 0.0;
    for (; e < end; e += 256u) {
        uint idx = (b * pc.c_out + c) * plane_out + oy * pc.out_w + ox;
        float g = gy[idx];
        if (pc.relu == 0u || y[idx] > 0.0) {
            if (t == taps) {
                s += g;
            } else {
                uint iy = oy * pc.stride + ky - pc.pad; // wraps when negative
                uint ix = ox * pc.stride + kx - pc.pad;
                if (iy < pc.h && ix < pc.w) {
                    s += g * x[((b * pc.c_in + c) * pc.h + iy) * pc.w + ix];
                }
            }
        }
        ox += d_x;
        oy += d_y;
        if (ox >= pc.out_w) {
            ox -= pc.out_w;
            oy += 1u;
        }
        b += d_b;
        if (oy >= pc.out_h) {
            oy -= pc.out_h;
            b += 1u;
        }
    }
    float v = workgroup_sum(s);
    if (gl_LocalInvocationID.x == 0u) {
        if (pc.splits > 1u) {
            partial[(split * pc.c_out + c) * (taps + 1u) + t] = v;
        } else if (t < taps) {
            gw[c * taps + t] = v;
        } else {
            gb[c] = v;
        }
    }
}
