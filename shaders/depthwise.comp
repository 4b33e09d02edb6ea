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

#include "depthwise_storage.glsl"
