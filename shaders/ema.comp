#version 450
// ema: the weight average e ← d·e + (1 − d)·w over len values (ops::Ema), after an optimizer
// step. The decay d comes from the hyper tensor (hyper[4], recording::HYPER_EMA_DECAY) at run
// time, so one recorded command buffer serves every step. `precise` keeps the two products
// and the sum unfused, as the CPU computes them. Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer Ema { float e[]; };
layout(std430, set = 0, binding = 1) readonly buffer Param { float w[]; };
layout(std430, set = 0, binding = 2) readonly buffer Hyper { float hyper[]; };

layout(push_constant) uniform Push {
    uint len;
} pc;

void main() {
    float d = hyper[4];
    float keep = 1.0 - d;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        precise float r = d * e[i] + keep * w[i];
        e[i] = r;
    }
}
