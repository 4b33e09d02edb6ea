#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d: dense and grouped convolutions, one output pixel an invocation (conv2d.glsl), for
// GPUs where the batch has few pixels: more per invocation would leave them idle (NVIDIA
// H200, det-s's stem at batch 1: 0.011 ms with one, 0.017 ms with four). Larger batches take
// conv2d_quad (lower.rs: QUAD_MIN_PIXELS).

#define PX 1u
#include "conv2d.glsl"
