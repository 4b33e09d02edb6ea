#version 450
#extension GL_GOOGLE_include_directive : require
// loss_finish: second pass of the loss (see loss_partial): one workgroup adds the `parts`
// partial sums (each invocation a strided subset, then workgroup_sum.glsl, in a fixed
// order) and writes [total, focal, offset, size, centres, giou].

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Partial { vec4 partial[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Loss { float loss[]; };

#include "loss.glsl"

#define WG_SIZE 256u
#include "workgroup_sum.glsl"

void main() {
    vec4 s = vec4(0.0);
    float g = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.parts; i += 256u) {
        s += partial[2u * i];
        g += partial[2u * i + 1u].x;
    }
    vec4 total = workgroup_sum4(s);
    float giou_total = workgroup_sum(g);
    if (gl_LocalInvocationID.x == 0u) {
        write_loss(total, giou_total);
    }
}
