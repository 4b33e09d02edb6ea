#version 450
// adamw_ema: an AdamW update (adamw.comp) and the weight average that follows it (ema.comp)
// over the same len parameters, in one pass: the lowering fuses each recorded AdamW step with
// the Ema step of the same tensor right after it, which halves the optimizer's dispatches and
// reads each new weight from a register instead of memory. The arithmetic is the two
// kernels', in the same order (`precise` as in ema.comp), so the results are the same bits.
// Grid-stride loop.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer Param { float w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Grad { float g[]; };
layout(std430, set = 0, binding = 2) buffer M { float m[]; };
layout(std430, set = 0, binding = 3) buffer V { float v[]; };
layout(std430, set = 0, binding = 4) readonly buffer Hyper { float hyper[]; };
layout(std430, set = 0, binding = 5) buffer Ema { float e[]; };

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
    float d = hyper[4];
    float keep = 1.0 - d;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.len; i += step) {
        float gi = g[i] * grad_scale;
        float wi = w[i] * (1.0 - lr * pc.weight_decay);
        float mi = pc.beta1 * m[i] + (1.0 - pc.beta1) * gi;
        float vi = pc.beta2 * v[i] + (1.0 - pc.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float wn = wi - lr * (mi / c1) / (sqrt(vi / c2) + pc.eps);
        w[i] = wn;
        precise float r = d * e[i] + keep * wn;
        e[i] = r;
    }
}
