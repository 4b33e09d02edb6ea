#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// pointwise_thin_f16: pointwise_thin with f16 operands and products, f32 sums (f16.glsl), for
// devices with shaderFloat16 when --fp16 asks for it (lower.rs: Kernel::fp16_variant).

#define F16
#include "pointwise_thin.glsl"
