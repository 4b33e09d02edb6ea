#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// loss_partial_subgroup: loss_partial.glsl with the workgroup's sums by subgroup operations
// (workgroup_sum.glsl).
#define SUBGROUPS
#include "loss_partial.glsl"
