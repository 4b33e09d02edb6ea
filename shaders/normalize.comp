#version 450
// normalize: records (u8 HWC RGB images, record_stride bytes apart) → f32 NCHW network input,
// value byte / 255, mirrored horizontally with flip (ops::Normalize). The bytes are read as
// little-endian 32-bit words. One invocation per output element, grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Records { uint words[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint n;
    uint h;
    uint w;
    uint record_stride;
    uint flip;
} push_;

// Compiled per shape where constant 1 is set (compute/vulkan/lower.rs: shape_constants): word
// i of the push block is then constant 2 + i, which the compiler folds into the index
// arithmetic. `pc` reads whichever holds the values.
layout(constant_id = 1) const bool SHAPE_SPECIALISED = false;
layout(constant_id = 2) const uint SHAPE_N = 0u;
layout(constant_id = 3) const uint SHAPE_H = 0u;
layout(constant_id = 4) const uint SHAPE_W = 0u;
layout(constant_id = 5) const uint SHAPE_RECORD_STRIDE = 0u;
layout(constant_id = 6) const uint SHAPE_FLIP = 0u;

struct NormalizeShape {
    uint n;
    uint h;
    uint w;
    uint record_stride;
    uint flip;
};

// Read once, at the start of main (a global with an initializer).
NormalizeShape pc = NormalizeShape(
    SHAPE_SPECIALISED ? SHAPE_N : push_.n,
    SHAPE_SPECIALISED ? SHAPE_H : push_.h,
    SHAPE_SPECIALISED ? SHAPE_W : push_.w,
    SHAPE_SPECIALISED ? SHAPE_RECORD_STRIDE : push_.record_stride,
    SHAPE_SPECIALISED ? SHAPE_FLIP : push_.flip
);

void main() {
    uint plane = pc.h * pc.w;
    uint len = pc.n * 3u * plane;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint bc = i / plane;
        uint q = i - bc * plane;
        uint b = bc / 3u;
        uint c = bc - 3u * b;
        uint yy = q / pc.w;
        uint xx = q - yy * pc.w;
        if (pc.flip != 0u) {
            xx = pc.w - 1u - xx;
        }
        uint at = b * pc.record_stride + (yy * pc.w + xx) * 3u + c;
        uint byte = (words[at >> 2] >> ((at & 3u) * 8u)) & 0xffu;
        o[i] = float(byte) / 255.0;
    }
}
