#version 450
#extension GL_GOOGLE_include_directive : require
// sum_squares: see sum_squares.glsl.
#include "sum_squares.glsl"
