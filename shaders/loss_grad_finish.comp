#version 450
#extension GL_GOOGLE_include_directive : require
// loss_grad_finish: loss_finish and loss_grad in one dispatch, for a loss split into parts
// whose gradient follows it (a training step; lower.rs): one pass fewer. The first
// invocation adds the parts' sums as loss_finish does (finish_loss in loss.glsl: the same
// bits) and writes the loss tensor; every invocation adds the parts' centre counts itself
// for N = max(1, centres) (whole numbers: the same N) and computes its share of the gradient
// (loss_grad.glsl). No barrier: on llvmpipe one would run the whole kernel as coroutines.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Pred { float pred[]; };
layout(std430, set = 0, binding = 1) readonly buffer Target { float target[]; };
// The parts as vec4 texels (kernels.rs: KernelInfo::texels): on llvmpipe a fetch is a
// vector gather, where a storage-buffer load walks the lanes one by one.
layout(set = 0, binding = 2) uniform samplerBuffer partial;
layout(std430, set = 0, binding = 3) writeonly buffer Loss { float loss[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Grad { float grad[]; };

#define LOSS_PARTS
#define PARTIAL(k) texelFetch(partial, int(k))
#include "loss.glsl"
#include "loss_grad.glsl"

void main() {
    if (gl_GlobalInvocationID.x == 0u) {
        finish_loss();
    }
    float centres = 0.0;
    for (uint i = 0u; i < pc.parts; i++) {
        centres += PARTIAL(2u * i).w;
    }
    loss_gradients(1.0 / max(1.0, centres));
}
