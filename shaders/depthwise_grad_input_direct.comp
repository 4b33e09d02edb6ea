#version 450
#extension GL_GOOGLE_include_directive : require
// depthwise_grad_input_direct: depthwise_grad_input.comp for CPU-type devices, its inputs
// read as uniform texel buffers (kernels.rs: KernelInfo::texels): on llvmpipe a texel fetch
// is one vector gather, where a storage-buffer load walks the lanes one by one. The same
// grid and push block.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) uniform samplerBuffer wt;
layout(set = 0, binding = 1) uniform samplerBuffer y;
layout(set = 0, binding = 2) uniform samplerBuffer gy;
layout(std430, set = 0, binding = 3) writeonly buffer GX { vec4 gx4[]; };
#define STORE(i, v) gx4[(i) / 4u][(i) % 4u] = (v)
#define STORE4(q, v) gx4[q] = (v)
#define WT_AT(i) texelFetch(wt, int(i)).x
#define Y_AT(i) texelFetch(y, int(i)).x
#define GY_AT(i) texelFetch(gy, int(i)).x

// Eight inputs of a row an invocation (kernels.rs: DEPTHWISE_DIRECT_OUTPUTS).
#define OX 8u
// Two rows of them (kernels.rs: DEPTHWISE_DIRECT_ROWS).
#define OY 2u

#include "conv_push.glsl"
#include "depthwise_grad_input.glsl"
