#version 450
// add_assign: dst += src over len elements (ops::Add: gradient accumulation where a tensor
// has two consumers). Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer Dst { float dst[]; };
layout(std430, set = 0, binding = 1) readonly buffer Src { float src[]; };

layout(push_constant) uniform Push {
    uint len;
} pc;

void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        dst[i] = dst[i] + src[i];
    }
}
