#version 450
// sgd: SGD with momentum and L2 weight decay over len parameters (ops::SgdMomentum,
// PyTorch's formulation); lr from hyper[0] and the gradient's scale from hyper[5] at run time
// (the op's own lr is not used):
//   g ← grad·grad_scale + wd·w;  v ← momentum·v + g;  w ← w − lr·v
// Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer Param { float w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Grad { float g[]; };
layout(std430, set = 0, binding = 2) buffer Velocity { float vel[]; };
layout(std430, set = 0, binding = 3) readonly buffer Hyper { float hyper[]; };

layout(push_constant) uniform Push {
    uint len;
    float momentum;
    float weight_decay;
} pc;

void main() {
    float lr = hyper[0];
    float grad_scale = hyper[5]; // 1, or the clip step's scale
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        float wi = w[i];
        float gi = g[i] * grad_scale + pc.weight_decay * wi;
        float vi = pc.momentum * vel[i] + gi;
        vel[i] = vi;
        w[i] = wi - lr * vi;
    }
}
