#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// sum_squares_subgroup: sum_squares.glsl with the workgroup's sums by subgroup operations
// (workgroup_sum.glsl).
#define SUBGROUPS
#include "sum_squares.glsl"
