#version 450
// conv2d_grad_input_direct: conv2d_grad_input's gx (dense, grouped and pointwise convs)
//     GX[c][q] = Σ_(o,ky,kx) W[o][c][ky][kx] · G[o][(q + pad − (ky,kx)) / stride]
// summed straight from the buffers, with no shared memory and no barrier, for CPU-type
// devices (lavapipe): there the tiled kernel's two barriers per 16 terms cost more than its
// reuse saves (det-s's training step at batch 32 on 2 cores: 1.65 s of 5.3 s in it). G is the
// output gradient masked by y > 0 with a ReLU.
//
// The grid of the tiled kernel: a workgroup covers 32 input channels × 64 pixels of one image
// and group, with 16 × 4 invocations: invocation (tx, ty) channels m0 + ty + 4·i (i < 8) and
// pixels n0 + tx + 16·j (j < 4), so neighbouring invocations read neighbouring pixels, and
// each gradient value loaded serves eight channels.
//
// Grid: (⌈N/64⌉, ⌈M/32⌉, n·groups), N = h·w, M = c_in/groups.

layout(local_size_x = 16, local_size_y = 4, local_size_z = 1) in;

#define CH 8

// The inputs are read as uniform texel buffers (kernels.rs: KernelInfo::texels): on llvmpipe
// a texel fetch is one vector gather, where a storage-buffer load walks the lanes one by one.
layout(set = 0, binding = 0) uniform samplerBuffer wt;
layout(set = 0, binding = 1) uniform samplerBuffer y;
layout(set = 0, binding = 2) uniform samplerBuffer gy;
layout(std430, set = 0, binding = 3) writeonly buffer GX { float gx[]; };

#include "conv_push.glsl"

// s / stride where s ≥ 0 is a multiple of the stride, else a value ≥ limit (no term).
uint on_grid(int s, uint limit) {
    if (s < 0) {
        return limit;
    }
    uint u = uint(s);
    uint d = u / pc.stride;
    return d * pc.stride == u ? d : limit;
}

// The output gradient at idx, masked by the ReLU.
float grad_at(uint idx) {
    float g = texelFetch(gy, int(idx)).x;
    if (pc.relu != 0u && !(texelFetch(y, int(idx)).x > 0.0)) {
        g = 0.0;
    }
    return g;
}

void main() {
    uint img = gl_WorkGroupID.z / pc.groups;
    uint grp = gl_WorkGroupID.z % pc.groups;
    uint cig = pc.c_in / pc.groups;
    uint cog = pc.c_out / pc.groups;
    uint taps = pc.k * pc.k;
    uint plane = pc.h * pc.w;
    uint plane_out = pc.out_h * pc.out_w;
    uint g_base = (img * pc.c_out + grp * cog) * plane_out;
    uint m0 = gl_WorkGroupID.y * 32u + gl_LocalInvocationID.y;
    uint n0 = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x;
    // Out-of-range channels and pixels read a valid element (clamped) and are not stored.
    uint c[CH];
    uint q[4];
    for (uint i = 0u; i < CH; i++) {
        c[i] = min(m0 + 4u * i, cig - 1u);
    }
    for (uint j = 0u; j < 4u; j++) {
        q[j] = min(n0 + 16u * j, plane - 1u);
    }
    float acc[CH][4];
    for (uint i = 0u; i < CH; i++) {
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    uint w_row = cig * taps;
    if (taps == 1u && pc.stride == 1u && pc.pad == 0u) {
        // Pointwise: input pixel q is output pixel q.
        for (uint o = 0u; o < cog; o++) {
            uint w_at = (grp * cog + o) * w_row;
            float a[CH];
            for (uint i = 0u; i < CH; i++) {
                a[i] = texelFetch(wt, int(w_at + c[i])).x;
            }
            uint row = g_base + o * plane_out;
            for (uint j = 0u; j < 4u; j++) {
                float g = grad_at(row + q[j]);
                for (uint i = 0u; i < CH; i++) {
                    acc[i][j] += a[i] * g;
                }
            }
        }
    } else {
        int sy[4];
        int sx[4];
        for (uint j = 0u; j < 4u; j++) {
            uint iy = q[j] / pc.w;
            sy[j] = int(iy + pc.pad);
            sx[j] = int(q[j] - iy * pc.w + pc.pad);
        }
        for (uint o = 0u; o < cog; o++) {
            uint w_at = (grp * cog + o) * w_row;
            uint row = g_base + o * plane_out;
            for (uint t = 0u; t < taps; t++) {
                uint ky = t / pc.k;
                uint kx = t - ky * pc.k;
                float a[CH];
                for (uint i = 0u; i < CH; i++) {
                    a[i] = texelFetch(wt, int(w_at + c[i] * taps + t)).x;
                }
                for (uint j = 0u; j < 4u; j++) {
                    uint oy = on_grid(sy[j] - int(ky), pc.out_h);
                    uint ox = on_grid(sx[j] - int(kx), pc.out_w);
                    if (oy < pc.out_h && ox < pc.out_w) {
                        float g = grad_at(row + oy * pc.out_w + ox);
                        for (uint i = 0u; i < CH; i++) {
                            acc[i][j] += a[i] * g;
                        }
                    }
                }
            }
        }
    }
    for (uint i = 0u; i < CH; i++) {
        uint m = m0 + 4u * i;
        if (m >= cig) {
            continue;
        }
        for (uint j = 0u; j < 4u; j++) {
            uint qj = n0 + 16u * j;
            if (qj < plane) {
                gx[(img * pc.c_in + grp * cig + m) * plane + qj] = acc[i][j];
            }
        }
    }
}
