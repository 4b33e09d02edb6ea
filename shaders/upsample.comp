#version 450
// upsample: nearest-neighbour ×2 (ops::Upsample2x), n·c planes of h × w → 2h × 2w; output
// (y, x) copies input (y/2, x/2), plus a residual (binding 2, shaped as y) where the lowering
// folds the add after it in (pc.skip). One invocation per output element, grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer Skip { float skip[]; };

layout(push_constant) uniform Push {
    uint n;
    uint c;
    uint h;
    uint w;
    uint skip; // 1: add binding 2
} push_;

// Compiled per shape where constant 1 is set (compute/vulkan/lower.rs: shape_constants): word
// i of the push block is then constant 2 + i, which the compiler folds into the index
// arithmetic. `pc` reads whichever holds the values.
layout(constant_id = 1) const bool SHAPE_SPECIALISED = false;
layout(constant_id = 2) const uint SHAPE_N = 0u;
layout(constant_id = 3) const uint SHAPE_C = 0u;
layout(constant_id = 4) const uint SHAPE_H = 0u;
layout(constant_id = 5) const uint SHAPE_W = 0u;
layout(constant_id = 6) const uint SHAPE_SKIP = 0u;

struct UpsampleShape {
    uint n;
    uint c;
    uint h;
    uint w;
    uint skip;
};

// Read once, at the start of main (a global with an initializer).
UpsampleShape pc = UpsampleShape(
    SHAPE_SPECIALISED ? SHAPE_N : push_.n,
    SHAPE_SPECIALISED ? SHAPE_C : push_.c,
    SHAPE_SPECIALISED ? SHAPE_H : push_.h,
    SHAPE_SPECIALISED ? SHAPE_W : push_.w,
    SHAPE_SPECIALISED ? SHAPE_SKIP : push_.skip
);

void main() {
    uint ow = 2u * pc.w;
    uint plane_out = 4u * pc.h * pc.w;
    uint len = pc.n * pc.c * plane_out;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint bc = i / plane_out;
        uint p = i - bc * plane_out;
        uint oy = p / ow;
        uint ox = p - oy * ow;
        float v = x[(bc * pc.h + oy / 2u) * pc.w + ox / 2u];
        if (pc.skip != 0u) {
            v += skip[i];
        }
        y[i] = v;
    }
}
