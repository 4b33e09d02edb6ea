#version 450
#extension GL_GOOGLE_include_directive : require
// pointwise_thin: the pointwise kernel with one output per invocation, for layers whose tiled
// GEMM grid has too few workgroups to fill a GPU, f32 arithmetic (pointwise_thin.glsl).

#include "pointwise_thin.glsl"
