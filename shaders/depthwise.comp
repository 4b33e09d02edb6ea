#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise: y = relu?(conv(x, w) + b) for a depthwise convolution (groups = c_in = c_out,
// ops::Conv2d): one invocation per output element, k·k taps of its own channel, padding
// applied on the fly; bias and ReLU fused. A grid-stride loop covers any grid.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };

#include "conv_push.glsl"

void main() {
    uint plane_out = pc.out_h * pc.out_w;
    uint len = pc.n * pc.c_out * plane_out;
    uint taps = pc.k * pc.k;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint bc = i / plane_out; // b·c + c
        uint p = i - bc * plane_out;
        uint c = bc % pc.c_out;
        uint oy = p / pc.out_w;
        uint ox = p - oy * pc.out_w;
        uint xbase = bc * pc.h * pc.w;
        uint wbase = c * taps;
        float s = 0.0;
        for (uint ky = 0u; ky < pc.k; ky++) {
            uint iy = oy * pc.stride + ky - pc.pad; // wraps when negative
            if (iy >= pc.h) {
                continue;
            }
            for (uint kx = 0u; kx < pc.k; kx++) {
                uint ix = ox * pc.stride + kx - pc.pad;
                if (ix < pc.w) {
                    s += wt[wbase + ky * pc.k + kx] * x[xbase + iy * pc.w + ix];
                }
            }
        }
        float v = s + bias[c];
        if (pc.relu != 0u) {
            v = max(v, 0.0);
        }
        y[i] = v;
    }
}
