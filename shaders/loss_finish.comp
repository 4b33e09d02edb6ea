#version 450
#extension GL_GOOGLE_include_directive : require
// loss_finish: second pass of the loss (see loss_partial): one workgroup adds the `parts`
// partial sums (each invocation a strided subset, then a tree in shared memory, in a fixed
// order) and writes [total, focal, offset, size, centres].

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Partial { vec4 partial[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Loss { float loss[]; };

#include "loss.glsl"

shared vec4 sums[256];

void main() {
    vec4 s = vec4(0.0);
    for (uint i = gl_LocalInvocationID.x; i < pc.parts; i += 256u) {
        s += partial[i];
    }
    sums[gl_LocalInvocationID.x] = s;
    barrier();
    for (uint half_ = 128u; half_ > 0u; half_ >>= 1) {
        if (gl_LocalInvocationID.x < half_) {
            sums[gl_LocalInvocationID.x] += sums[gl_LocalInvocationID.x + half_];
        }
        barrier();
    }
    if (gl_LocalInvocationID.x == 0u) {
        vec4 t = sums[0];
        float norm = max(1.0, t.w);
        float focal = t.x / norm;
        float off = pc.offset_weight * t.y / norm;
        float size = pc.size_weight * t.z / norm;
        loss[0] = focal + off + size;
        loss[1] = focal;
        loss[2] = off;
        loss[3] = size;
        loss[4] = t.w;
    }
}
