#version 450
// adamw: AdamW over len parameters (ops::AdamW, PyTorch's formulation). lr, step and the bias
// corrections c1 = 1 − β1^step, c2 = 1 − β2^step come from the hyper tensor at run time
// ([lr, step, c1, c2, ema_decay, grad_scale], recording::HYPER_LEN), not from the op, so one
// recorded command buffer serves every step; g is the gradient times grad_scale (1, or the
// clip step's scale):
//   w ← w·(1 − lr·wd);  m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²;
//   w ← w − lr·(m/c1) / (√(v/c2) + eps)
// Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer Param { float w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Grad { float g[]; };
layout(std430, set = 0, binding = 2) buffer M { float m[]; };
layout(std430, set = 0, binding = 3) buffer V { float v[]; };
layout(std430, set = 0, binding = 4) readonly buffer Hyper { float hyper[]; };

layout(push_constant) uniform Push {
    uint len;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
} pc;

void main() {
    float lr = hyper[0];
    float c1 = hyper[2];
    float c2 = hyper[3];
    float grad_scale = hyper[5]; // 1, or the clip step's scale
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        float gi = g[i] * grad_scale;
        float wi = w[i] * (1.0 - lr * pc.weight_decay);
        float mi = pc.beta1 * m[i] + (1.0 - pc.beta1) * gi;
        float vi = pc.beta2 * v[i] + (1.0 - pc.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - lr * (mi / c1) / (sqrt(vi / c2) + pc.eps);
    }
}
