#version 450
// masked_add_assign: dst = mask_by > 0 ? dst + src : 0 over len elements: a gradient's
// residual contribution added and the ReLU mask of the layer that produced mask_by applied,
// in one pass (compute::fusion::grad_stores; that layer's backward pass then takes dst as
// masked). Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer Dst { float dst[]; };
layout(std430, set = 0, binding = 1) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 2) readonly buffer MaskBy { float mask_by[]; };

layout(push_constant) uniform Push {
    uint len;
} pc;

void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        float sum = dst[i] + src[i];
        dst[i] = mask_by[i] > 0.0 ? sum : 0.0;
    }
}
