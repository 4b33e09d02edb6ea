#version 450
// conv2d_grad_input_direct4: conv2d_grad_input_direct for pointwise convs (1×1, stride 1, no
// padding, one group) whose plane and input channels are multiples of four:
//     GX[c][q] = Σ_o W[o][c] · G[o][q]
// with the weights, the output gradient and y read as uniform texel buffers of vec4s
// (kernels.rs: TexelFormat::F32x4): each fetch, one vector gather on llvmpipe, brings four
// values where the scalar kernel's brings one. G is masked by y > 0 with a ReLU.
//
// The same grid: a workgroup covers 32 input channels × 64 pixels of one image, with 16 × 4
// invocations: invocation (tx, ty) the eight channels m0 + 8·ty .. + 7 (two vec4s of a
// weight row) and the four pixels 4·(q0 + tx) .. + 3 (one vec4 of a gradient row). The sums
// run over the output channels in order, as in conv2d_grad_input_direct.
//
// Grid: (⌈N/64⌉, ⌈M/32⌉, n), N = h·w, M = c_in.

layout(local_size_x = 16, local_size_y = 4, local_size_z = 1) in;

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
    uint m0 = gl_WorkGroupID.y * 32u + 8u * gl_LocalInvocationID.y;
    uint q = gl_WorkGroupID.x * 16u + gl_LocalInvocationID.x;
    // Out-of-range channels and pixels read a valid texel (clamped) and are not stored, so
    // the loop has no branch.
    uint c4a = min(m0 / 4u, c_quads - 1u);
    uint c4b = min(m0 / 4u + 1u, c_quads - 1u);
    uint qc = min(q, quads - 1u);
    vec4 acc[8];
    for (uint i = 0u; i < 8u; i++) {
        acc[i] = vec4(0.0);
    }
    for (uint o = 0u; o < pc.c_out; o++) {
        uint w_at = o * c_quads;
        vec4 wa = texelFetch(wt, int(w_at + c4a));
        vec4 wb = texelFetch(wt, int(w_at + c4b));
        int at = int(g_base + o * quads + qc);
        vec4 g = texelFetch(gy, at);
        if (pc.relu != 0u) {
            g = mix(vec4(0.0), g, greaterThan(texelFetch(y, at), vec4(0.0)));
        }
        for (uint i = 0u; i < 4u; i++) {
            acc[i] += wa[i] * g;
            acc[4u + i] += wb[i] * g;
        }
    }
    if (q >= quads) {
        return;
    }
    for (uint i = 0u; i < 8u; i++) {
        uint c = m0 + i;
        if (c < pc.c_in) {
            gx[(img * pc.c_in + c) * quads + q] = acc[i];
        }
    }
}
