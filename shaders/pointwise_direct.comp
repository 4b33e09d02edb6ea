#version 450
// pointwise_direct: the pointwise kernel (pointwise.comp: y = relu?(W·x + b) (+ skip), a 1×1,
// stride-1, unpadded, one-group conv) with no shared memory and no barrier: each invocation sums its
// outputs straight from the buffers. Used on CPU-type devices (lavapipe), which run a
// workgroup's lanes in groups and switch between all of them at every barrier: there the
// tiled GEMM's two barriers per 16-deep step cost more than its reuse saves (det-s forward,
// batch 1: the ten pointwise convs took 43.5 ms tiled, 25 ms direct, on 2 cores).
//
// A workgroup covers 32 output channels × 128 pixels of one image (the tiled kernel's
// channels, twice its pixels), with 16 × 4 invocations: invocation (tx, ty) channels
// m0 + ty + 4·i (i < 8) and pixels n0 + tx + 16·j (j < PX = 8), so each input value loaded
// serves eight channels and each weight eight pixels. llvmpipe gathers every load lane by
// lane (their addresses are not uniform to it), so loads per multiply-add bound the kernel:
// with two channels det-s's ten pointwise convs at batch 32 took 0.76 s on lavapipe, 2 cores,
// 0.35 s with eight; at batch 1 they took 14.0–17.4 ms with four pixels, 12.1–13.4 ms with
// eight, no better with sixteen.
//
// Grid: (⌈N/128⌉, ⌈M/32⌉, n), N = h·w, M = c_out (lower.rs: POINTWISE_DIRECT_PIXELS).

layout(local_size_x = 16, local_size_y = 4, local_size_z = 1) in;

#define CH 8
#define PX 8u

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) readonly buffer Skip { float skip[]; };

#include "conv_push.glsl"

void main() {
    uint img = gl_WorkGroupID.z;
    uint plane = pc.h * pc.w;
    uint x_base = img * pc.c_in * plane;
    uint m0 = gl_WorkGroupID.y * 32u + gl_LocalInvocationID.y;
    uint n0 = gl_WorkGroupID.x * (16u * PX) + gl_LocalInvocationID.x;
    // Out-of-range rows and columns read a valid element (clamped) and are not stored, so the
    // loop has no branch.
    uint o[CH];
    uint p[PX];
    for (uint i = 0u; i < CH; i++) {
        o[i] = min(m0 + 4u * i, pc.c_out - 1u);
    }
    for (uint j = 0u; j < PX; j++) {
        p[j] = min(n0 + 16u * j, plane - 1u);
    }
    float acc[CH][PX];
    for (uint i = 0u; i < CH; i++) {
        for (uint j = 0u; j < PX; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint c = 0u; c < pc.c_in; c++) {
        float a[CH];
        for (uint i = 0u; i < CH; i++) {
            a[i] = wt[o[i] * pc.c_in + c];
        }
        uint row = x_base + c * plane;
        for (uint j = 0u; j < PX; j++) {
            float b = x[row + p[j]];
            for (uint i = 0u; i < CH; i++) {
                acc[i][j] += a[i] * b;
            }
        }
    }
    for (uint i = 0u; i < CH; i++) {
        uint oi = m0 + 4u * i;
        if (oi >= pc.c_out) {
            continue;
        }
        float b = bias[oi];
        for (uint j = 0u; j < PX; j++) {
            uint pj = n0 + 16u * j;
            if (pj < plane) {
                float v = acc[i][j] + b;
                if (pc.relu != 0u) {
                    v = max(v, 0.0);
                }
                uint at = (img * pc.c_out + oi) * plane + pj;
                if (pc.skip != 0u) {
                    v += skip[at];
                }
                y[at] = v;
            }
        }
    }
}
