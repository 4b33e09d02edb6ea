#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_direct_rgb: conv2d_direct.comp reading the records (conv2d.glsl with RGB_INPUT), the
// stem with its normalisation folded in, for CPU-type devices.

#define PX 8u
#define TEXELS
#define RGB_INPUT
#include "conv2d.glsl"
