#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d: dense and grouped convolutions, one output pixel an invocation (conv2d.glsl). On a
// GPU the stem at batch 1 has few pixels; more per invocation would leave it idle (NVIDIA
// H200: 0.011 ms with one, 0.017 ms with four).

#define PX 1u
#include "conv2d.glsl"
