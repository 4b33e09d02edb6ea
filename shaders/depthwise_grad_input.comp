#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise_grad_input: gx of a depthwise convolution (ops::Conv2d), gathered: an invocation
// computes four neighbouring inputs q of a row, each the sum of w[c][ky][kx] ·
// G[c][(q + pad − (ky, kx)) / stride] over the taps whose source lands on the stride grid
// inside the output, each weight loaded once for the four and the row decomposed once (as
// depthwise.comp). G is the output gradient masked by y > 0 with a ReLU. A grid-stride loop
// covers any grid (lower.rs: one invocation per four inputs).

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 3) writeonly buffer GX { float gx[]; };
#define STORE(i, v) gx[i] = (v)
#define WT_AT(i) wt[i]
#define Y_AT(i) y[i]
#define GY_AT(i) gy[i]

#include "conv_push.glsl"
#include "depthwise_grad_input.glsl"
