#version 450
// pointwise_direct4: pointwise_direct.comp for layers whose plane and input channels are
// multiples of four (every pointwise conv of the det presets), reading the input and the
// weights as vec4 texels and storing vec4s. llvmpipe compiles a storage-buffer access whose
// address is not a constant into a walk over the lanes with a branch for each (once per
// access, whatever its width), where a texel fetch is a vector gather: on det-s's training
// step this kernel took a third of pointwise_direct's time (vec4 storage-buffer loads alone,
// 0.6–0.9 of it).
//
// A workgroup covers 32 output channels × 128 pixels of one image, with 16 × 4 invocations:
// invocation (tx, ty) channels m0 + ty + 4·i (i < 8) and the four-pixel groups
// q0 + tx + 16·j (j < 2). Each step loads, for four input channels, one vec4 of weights per
// output channel (the channels are contiguous in a weight row) and one vec4 of pixels per
// group and channel. The sums run over the input channels in order, as in pointwise_direct.
//
// Grid: (⌈N/128⌉, ⌈M/32⌉, n), N = h·w, M = c_out (lower.rs: POINTWISE_DIRECT_PIXELS).

layout(local_size_x = 16, local_size_y = 4, local_size_z = 1) in;

#define CH 8
#define QX 2u

// The input and the weights are read as uniform texel buffers of vec4s (kernels.rs:
// TexelFormat::F32x4): on llvmpipe a texel fetch is one vector gather, where a storage-buffer
// load walks the lanes one by one.
layout(set = 0, binding = 0) uniform samplerBuffer x;
layout(set = 0, binding = 1) uniform samplerBuffer wt;
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { vec4 y[]; };
layout(std430, set = 0, binding = 4) readonly buffer Skip { vec4 skip[]; };

#include "conv_push.glsl"

void main() {
    uint img = gl_WorkGroupID.z;
    uint quads = pc.h * pc.w / 4u;
    uint c_quads = pc.c_in / 4u;
    uint x_base = img * pc.c_in * quads;
    uint m0 = gl_WorkGroupID.y * 32u + gl_LocalInvocationID.y;
    uint q0 = gl_WorkGroupID.x * (16u * QX) + gl_LocalInvocationID.x;
    // Out-of-range channels and groups read a valid element (clamped) and are not stored, so
    // the loop has no branch.
    uint w_row[CH];
    uint q[QX];
    for (uint i = 0u; i < CH; i++) {
        w_row[i] = min(m0 + 4u * i, pc.c_out - 1u) * c_quads;
    }
    for (uint j = 0u; j < QX; j++) {
        q[j] = min(q0 + 16u * j, quads - 1u);
    }
    vec4 acc[CH][QX];
    for (uint i = 0u; i < CH; i++) {
        for (uint j = 0u; j < QX; j++) {
            acc[i][j] = vec4(0.0);
        }
    }
    // Channel rows i and pixel groups j that no invocation of any workgroup has (c_out ≤ 4·i,
    // or a plane of at most 16·j groups: det-s's head and its 8 × 8 layers) are skipped; with
    // the shape compiled in (KernelInfo::shapes) they are not compiled at all.
    for (uint c = 0u; c < c_quads; c++) {
        vec4 a[CH];
        for (uint i = 0u; i < CH; i++) {
            if (4u * i < pc.c_out) {
                a[i] = texelFetch(wt, int(w_row[i] + c));
            }
        }
        uint row = x_base + 4u * c * quads;
        for (uint k = 0u; k < 4u; k++) {
            for (uint j = 0u; j < QX; j++) {
                if (16u * j >= quads) {
                    continue;
                }
                vec4 b = texelFetch(x, int(row + k * quads + q[j]));
                for (uint i = 0u; i < CH; i++) {
                    if (4u * i < pc.c_out) {
                        acc[i][j] += a[i][k] * b;
                    }
                }
            }
        }
    }
    for (uint i = 0u; i < CH; i++) {
        uint oi = m0 + 4u * i;
        if (oi >= pc.c_out) {
            continue;
        }
        float b = bias[oi];
        for (uint j = 0u; j < QX; j++) {
            uint qj = q0 + 16u * j;
            if (qj < quads) {
                vec4 v = acc[i][j] + b;
                if (pc.relu != 0u) {
                    v = max(v, vec4(0.0));
                }
                uint at = (img * pc.c_out + oi) * quads + qj;
                if (pc.skip != 0u) {
                    v += skip[at];
                }
                y[at] = v;
            }
        }
    }
}
