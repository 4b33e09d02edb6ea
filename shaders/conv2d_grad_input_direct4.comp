#version 450
// conv2d_grad_input_direct4: conv2d_grad_input_direct for pointwise convs (1×1, stride 1, no
// padding, one group) whose plane and input channels are multiples of four:
//     GX[c][q] = Σ_o W[o][c] · G[o][q]
// with the weights, the output gradient and y read as uniform texel buffers of vec4s
// (kernels.rs: TexelFormat::F32x4): each fetch, one vector gather on llvmpipe, brings four
// values where the scalar kernel's brings one. G is masked by y > 0 with a ReLU.
//
// The same grid: a workgroup covers 32 input channels × 64 pixels of one image, with 16 × 2
// invocations: invocation (tx, ty) the 16 channels m0 + 16·ty .. + 15 (CV = 4 vec4s of a
// weight row) and the four pixels 4·(q0 + tx) .. + 3 (one vec4 of a gradient row), so that
// each gradient fetch serves 16 channels (det-s's step on lavapipe: about 8 % less time than
// with 8). The sums run over the output channels in order, as in conv2d_grad_input_direct.
//
// Grid: (⌈N/64⌉, ⌈M/32⌉, n), N = h·w, M = c_in.

layout(local_size_x = 16, local_size_y = 2, local_size_z = 1) in;

// vec4s of input channels an invocation computes (CV·4 channels, 32 / (CV·4) invocation rows).
#define CV 4u

layout(set = 0, binding = 0) uniform samplerBuffer wt;
layout(set = 0, binding = 1) uniform samplerBuffer y;
layout(set = 0, binding = 2) uniform samplerBuffer gy;
layout(std430, set = 0, binding = 3) writeonly buffer GX { vec4 gx[]; };

#include "conv_push.glsl"

void main() {
    uint img = gl_WorkGroupID.z;
    uint quads = pc.h * pc.w / 4u;
    uint c_quads = pc.c_in / 4u;
    uint g_base = img * pc.c_out * quads;
    uint m0 = gl_WorkGroupID.y * 32u + 4u * CV * gl_LocalInvocationID.y;
    uint q = gl_WorkGroupID.x * 16u + gl_LocalInvocationID.x;
    if (m0 >= pc.c_in) {
        return; // no channel of this invocation's exists (16 input channels: half of them)
    }
    // Out-of-range channels and pixels read a valid texel (clamped) and are not stored, so
    // the loop has no branch.
    uint c4[CV];
    for (uint v = 0u; v < CV; v++) {
        c4[v] = min(m0 / 4u + v, c_quads - 1u);
    }
    uint qc = min(q, quads - 1u);
    vec4 acc[4u * CV];
    for (uint i = 0u; i < 4u * CV; i++) {
        acc[i] = vec4(0.0);
    }
    for (uint o = 0u; o < pc.c_out; o++) {
        uint w_at = o * c_quads;
        int at = int(g_base + o * quads + qc);
        vec4 g = texelFetch(gy, at);
        if (pc.relu != 0u) {
            g = mix(vec4(0.0), g, greaterThan(texelFetch(y, at), vec4(0.0)));
        }
        for (uint v = 0u; v < CV; v++) {
            vec4 wv = texelFetch(wt, int(w_at + c4[v]));
            for (uint i = 0u; i < 4u; i++) {
                acc[4u * v + i] += wv[i] * g;
            }
        }
    }
    if (q >= quads) {
        return;
    }
    for (uint i = 0u; i < 4u * CV; i++) {
        uint c = m0 + i;
        if (c < pc.c_in) {
            gx[(img * pc.c_in + c) * quads + q] = acc[i];
        }
    }
}
