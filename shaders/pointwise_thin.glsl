// The body of pointwise_thin.comp and pointwise_thin_f16.comp (F16: f16 operands, f16.glsl):
// the pointwise kernel (pointwise.comp: y = relu?(W·x + b) (+ skip), a 1×1,
// stride-1, unpadded, one-group conv) with one output per invocation, for layers whose tiled
// GEMM grid has too few workgroups to fill a GPU (a batch-1 forward pass: det-s's 16×16
// layers are eight 32×64 tiles). Each invocation walks the c_in inputs of its pixel; the
// x: pixels of a workgroup read consecutive addresses, its y: channels share them through
// the cache. The sum runs in input-channel order, as in the tiled kernel.
//
// Grid: (⌈N/64⌉, ⌈M/4⌉, n), N = h·w, M = c_out.

layout(local_size_x = 64, local_size_y = 4, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) readonly buffer Skip { float skip[]; };

#include "conv_push.glsl"
#include "f16.glsl"
#include "pointwise_store.glsl"

void main() {
    uint img = gl_WorkGroupID.z;
    uint plane = pc.h * pc.w;
    uint p = gl_GlobalInvocationID.x;
    uint o = gl_GlobalInvocationID.y;
    if (p >= plane || o >= pc.c_out) {
        return;
    }
    uint xi = img * pc.c_in * plane + p;
    uint wi = o * pc.c_in;
    float s = 0.0;
    for (uint c = 0u; c < pc.c_in; c++) {
        s += float(OPERAND(wt[wi + c]) * OPERAND(x[xi + c * plane]));
    }
    store_output((img * pc.c_out + o) * plane + p, s + bias[o]);
}
