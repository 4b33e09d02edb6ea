#version 450
// add_direct4: add.comp for CPU-type devices where len is a multiple of four (lower.rs:
// add_direct4_fits): a and b read as vec4 texels (kernels.rs: KernelInfo::texels4), which on
// llvmpipe is a vector gather where a storage-buffer load walks the lanes one by one; four
// sums an invocation, stored as one vec4. Grid-stride loop over len / 4.
layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) uniform samplerBuffer a;
layout(set = 0, binding = 1) uniform samplerBuffer b;
layout(std430, set = 0, binding = 2) writeonly buffer Out { vec4 o[]; };
layout(push_constant) uniform Push {
    uint len;
} pc;
void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len / 4u; i += step) {
        o[i] = texelFetch(a, int(i)) + texelFetch(b, int(i));
    }
}
