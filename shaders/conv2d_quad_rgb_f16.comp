#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// conv2d_quad_rgb_f16: conv2d_quad_rgb (reading the records, four output pixels of a row an invocation) with f16 inputs, weights and products, f32 sums
// (conv2d.glsl, f16.glsl), for devices with shaderFloat16 when --fp16 asks for it (lower.rs:
// Kernel::fp16_variant).

#define F16
#define PX 4u
#define RGB_INPUT
#include "conv2d.glsl"
