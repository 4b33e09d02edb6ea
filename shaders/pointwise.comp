#version 450
#extension GL_GOOGLE_include_directive : require
// pointwise: 1×1 conv + bias + ReLU as a tiled GEMM, f32 arithmetic (pointwise.glsl).

#include "pointwise.glsl"
