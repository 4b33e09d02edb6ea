#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// pointwise_f16: pointwise.comp's variant for devices with shaderFloat16 (Mali, Adreno, V3D
// and desktop GPUs run f16 at twice the f32 rate or better). The GEMM's shared tiles hold f16
// (half the shared memory and its bandwidth) and its products are f16; sums stay f32, so the
// error is that of rounding the inputs to f16 (about 5e-4 relative each), not of the depth.
// Opt-in (--fp16): training and the tight CPU-twin checks use the f32 kernel.

#define F16
#include "pointwise.glsl"
