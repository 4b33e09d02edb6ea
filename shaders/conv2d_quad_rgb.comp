#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_quad_rgb: conv2d_quad (four output pixels of a row an invocation) reading the records
// (conv2d.glsl, RGB_INPUT), as conv2d_rgb.

#define PX 4u
#define RGB_INPUT
#include "conv2d.glsl"
