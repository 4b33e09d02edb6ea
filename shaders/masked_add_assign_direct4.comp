#version 450
// masked_add_assign_direct4: masked_add_assign.comp for CPU-type devices where len is a
// multiple of four, as add_assign_direct4.comp: dst is bound twice, read as vec4 texels
// (binding 2) and written as a storage buffer (binding 0); each invocation reads its own four
// values before it writes them. Grid-stride loop over len / 4.
layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) writeonly buffer Dst { vec4 dst[]; };
layout(set = 0, binding = 1) uniform samplerBuffer src;
layout(set = 0, binding = 2) uniform samplerBuffer dst_in;
layout(set = 0, binding = 3) uniform samplerBuffer mask_by;
layout(push_constant) uniform Push {
    uint len;
} pc;
void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len / 4u; i += step) {
        vec4 sum = texelFetch(dst_in, int(i)) + texelFetch(src, int(i));
        dst[i] = mix(vec4(0.0), sum, greaterThan(texelFetch(mask_by, int(i)), vec4(0.0)));
    }
}
