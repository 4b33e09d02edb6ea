#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// depthwise_grad_weight_subgroup: depthwise_grad_weight.glsl with the workgroup's sums by
// subgroup operations (workgroup_sum.glsl).
#define SUBGROUPS
#include "depthwise_grad_weight.glsl"
