#version 450
// saxpy: y[i] = a * x[i] + y[i] for i < n.
//
// The Vulkan engine's proof kernel (compute/vulkan/kernels.rs): two storage buffers, a push
// constant block and the workgroup size as specialisation constant 0. A grid-stride loop, so
// any grid covers any n (the grid may be smaller than n / local size). `precise` forbids
// contracting a * x + y into an fma, so the result is the CPU's a * x + y bit for bit.

layout(local_size_x = 64) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n;
    float a;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        precise float r = pc.a * x[i] + y[i];
        y[i] = r;
    }
}
