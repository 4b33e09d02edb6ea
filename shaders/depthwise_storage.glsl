// depthwise.comp's and depthwise_f16.comp's declarations: storage-buffer bindings (the GPUs'
// kernels; depthwise_direct.comp reads texels) around the body, depthwise.glsl.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };
#define STORE(i, v) y[i] = (v)
#define X_AT(i) x[i]
#define WT_AT(i) wt[i]
#define BIAS_AT(i) bias[i]

#include "conv_push.glsl"
#include "depthwise.glsl"
