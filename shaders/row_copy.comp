#version 450
// row_copy: `rows` rows of `len` floats from src (row r at src_offset + r·src_stride) to dst
// (at dst_offset + r·dst_stride); nothing else of dst is written (ops::RowCopy). It gathers
// the levels of a multi-scale head into one output and scatters the gradient back.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { float dst[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint len;
    uint src_stride;
    uint src_offset;
    uint dst_stride;
    uint dst_offset;
} pc;

void main() {
    uint total = pc.rows * pc.len;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += step) {
        uint r = i / pc.len;
        uint j = i - r * pc.len;
        dst[pc.dst_offset + r * pc.dst_stride + j] = src[pc.src_offset + r * pc.src_stride + j];
    }
}
