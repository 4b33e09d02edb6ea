#version 450
#extension GL_GOOGLE_include_directive : require
// clip_grad: global gradient-norm clipping (crate::compute::ops::GradClip), after every
// sum_squares of the step: one workgroup adds the `tensors` sums of squares in sums[2..] (a
// strided subset each, then workgroup_sum.glsl, in a fixed order), and its first
// invocation writes norm = sqrt(total) and scale = min(1, max_norm / (norm + 1e-6)) into
// sums[0], sums[1] and the scale into hyper[5], where the optimizer kernels read it.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer Sums { float sums[]; };
layout(std430, set = 0, binding = 1) buffer Hyper { float hyper[]; };

layout(push_constant) uniform Push {
    uint tensors;
    float max_norm;
} pc;

#define WG_SIZE 256u
#include "workgroup_sum.glsl"

void main() {
    uint lane = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint i = lane; i < pc.tensors; i += 256u) {
        s += sums[2u + i];
    }
    float total = workgroup_sum(s);
    if (lane == 0u) {
        float norm = sqrt(total);
        float scale = min(1.0, pc.max_norm / (norm + 1e-6));
        sums[0] = norm;
        sums[1] = scale;
        hyper[5] = scale;
    }
}
