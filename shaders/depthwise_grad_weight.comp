#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise_grad_weight: see depthwise_grad_weight.glsl.
#include "depthwise_grad_weight.glsl"
