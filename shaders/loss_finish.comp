#version 450
#extension GL_GOOGLE_include_directive : require
// loss_finish: second pass of the loss (see loss_partial): one workgroup adds the `parts`
// partial sums (each invocation a strided subset, then a tree in shared memory, in a fixed
// order) and writes [total, focal, offset, size, centres, giou].

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Partial { vec4 partial[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Loss { float loss[]; };

#include "loss.glsl"

shared vec4 sums[256];
shared float giou_sums[256];

void main() {
    vec4 s = vec4(0.0);
    float g = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.parts; i += 256u) {
        s += partial[2u * i];
        g += partial[2u * i + 1u].x;
    }
    sums[gl_LocalInvocationID.x] = s;
    giou_sums[gl_LocalInvocationID.x] = g;
    barrier();
    for (uint half_ = 128u; half_ > 0u; half_ >>= 1) {
        if (gl_LocalInvocationID.x < half_) {
            sums[gl_LocalInvocationID.x] += sums[gl_LocalInvocationID.x + half_];
            giou_sums[gl_LocalInvocationID.x] += giou_sums[gl_LocalInvocationID.x + half_];
        }
        barrier();
    }
    if (gl_LocalInvocationID.x == 0u) {
        write_loss(sums[0], giou_sums[0]);
    }
}
