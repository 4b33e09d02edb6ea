#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_rgb: conv2d (one output pixel an invocation) reading the records (conv2d.glsl,
// RGB_INPUT): the stem with the normalisation folded in, where nothing else reads the
// normalised input (compute::fusion::normalized_convs).

#define PX 1u
#define RGB_INPUT
#include "conv2d.glsl"
