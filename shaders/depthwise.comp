#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise: y = relu?(conv(x, w) + b) for a depthwise convolution (groups = c_in = c_out,
// ops::Conv2d): an invocation computes four neighbouring outputs of a row, k·k taps of its
// own channel, each weight loaded once for the four, padding applied on the fly; bias and
// ReLU fused. The index decomposition (integer divisions, slow on every GPU and worse on
// CPU SIMD) is done once per four outputs. A grid-stride loop covers any grid
// (lower.rs: one invocation per four outputs).
//
// 3×3 kernels at stride 1 or 2 (det-s's) load each input row's window once, 6 or 9 values
// into registers, instead of one value per tap and output (12): on a CPU-type device every
// such load is a gather, and they bound the kernel.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };
#define STORE(i, v) y[i] = (v)
#define X_AT(i) x[i]
#define WT_AT(i) wt[i]
#define BIAS_AT(i) bias[i]

#include "conv_push.glsl"
#include "depthwise.glsl"
