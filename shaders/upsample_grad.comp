#version 450
// upsample_grad: backward of the nearest ×2 upsample (ops::Upsample2x): each input gradient
// is the sum of its four output gradients, (0,0) + (0,1) + (1,0) + (1,1) in that order. One
// invocation per input element (a gather: no atomics), grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer GY { float gy[]; };
layout(std430, set = 0, binding = 1) writeonly buffer GX { float gx[]; };

layout(push_constant) uniform Push {
    uint n;
    uint c;
    uint h;
    uint w;
} push_;

// Compiled per shape where constant 1 is set (compute/vulkan/lower.rs: shape_constants): word
// i of the push block is then constant 2 + i, which the compiler folds into the index
// arithmetic. `pc` reads whichever holds the values.
layout(constant_id = 1) const bool SHAPE_SPECIALISED = false;
layout(constant_id = 2) const uint SHAPE_N = 0u;
layout(constant_id = 3) const uint SHAPE_C = 0u;
layout(constant_id = 4) const uint SHAPE_H = 0u;
layout(constant_id = 5) const uint SHAPE_W = 0u;

struct UpsampleShape {
    uint n;
    uint c;
    uint h;
    uint w;
};

// Read once, at the start of main (a global with an initializer).
UpsampleShape pc = UpsampleShape(
    SHAPE_SPECIALISED ? SHAPE_N : push_.n,
    SHAPE_SPECIALISED ? SHAPE_C : push_.c,
    SHAPE_SPECIALISED ? SHAPE_H : push_.h,
    SHAPE_SPECIALISED ? SHAPE_W : push_.w
);

void main() {
    uint plane = pc.h * pc.w;
    uint ow = 2u * pc.w;
    uint len = pc.n * pc.c * plane;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint bc = i / plane;
        uint q = i - bc * plane;
        uint iy = q / pc.w;
        uint ix = q - iy * pc.w;
        uint top = (bc * 2u * pc.h + 2u * iy) * ow + 2u * ix;
        gx[i] = (gy[top] + gy[top + 1u]) + (gy[top + ow] + gy[top + ow + 1u]);
    }
}
