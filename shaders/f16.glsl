// The operand type of the fp16 variants (pointwise_f16, pointwise_thin_f16, depthwise_f16,
// conv2d*_f16). With F16 defined (the kernel enables
// GL_EXT_shader_explicit_arithmetic_types_float16; lowered only where the device has
// shaderFloat16 and --fp16 asked for it) a kernel's inputs and weights are rounded to f16
// and multiplied in f16, twice the f32 rate or better on Mali, Adreno, V3D and desktop GPUs;
// the sums stay f32, so the error is that of rounding the operands (about 5e-4 relative each),
// not of the depth. Without it, OPERAND is float and the kernel is its f32 self.
#ifdef F16
#define OPERAND float16_t
#else
#define OPERAND float
#endif
