#version 450
// add: out = a + b over len elements (ops::Add, the residual add). Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint len;
} pc;

void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        o[i] = a[i] + b[i];
    }
}
