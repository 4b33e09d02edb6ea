// The body of conv2d.comp and conv2d_quad.comp: y = relu?(conv(x, w) + b) for dense and
// grouped convolutions (ops::Conv2d; 1×1 convolutions take pointwise.comp), direct: no im2col
// buffer, no shared memory, no barrier. In det-s this is the stem (3 input channels: a GEMM's
// depth would be 27).
//
// One invocation per PX neighbouring output pixels of a row (of any image; the includer
// defines PX), eight output channels per workgroup row. For each input channel and tap the
// invocation loads its PX input values (neighbouring invocations read neighbouring pixels)
// and multiplies them into PX × 8 accumulators by weights that are the same for every
// invocation of the workgroup, each loaded once for the PX pixels. Padding is applied on the
// fly; bias and ReLU are fused into the store. With F16 the inputs and weights are f16
// (f16.glsl).
//
// With RGB_INPUT defined, binding 0 is the records instead (u8 HWC RGB images,
// pc.record_stride bytes apart, read as little-endian words, or as byte texels with TEXELS;
// one group, 3 input channels),
// normalised as they are read exactly as normalize.comp does (byte / 255, mirrored with
// pc.flip): the stem reading the records, so the normalised input is never written.
//
// Grid: (⌈n·out_h·⌈out_w/PX⌉ / 256⌉, ⌈(c_out/groups) / 8⌉, groups).

#define OCB 8u

layout(local_size_x = 256) in;

// With TEXELS defined (the direct kernels), the input and the weights are uniform texel
// buffers (kernels.rs: KernelInfo::texels): on llvmpipe a texel fetch is one vector gather,
// where a storage-buffer load walks the lanes one by one, the weights' uniform loads too
// (det-s's stem and its recomputation at batch 32 on 2 cores: 12–15 ms each, from 20–23).
#if defined(RGB_INPUT) && defined(TEXELS)
layout(set = 0, binding = 0) uniform usamplerBuffer records; // R8_UINT: a byte a texel
#elif defined(RGB_INPUT)
layout(std430, set = 0, binding = 0) readonly buffer Records { uint words[]; };
#elif defined(TEXELS)
layout(set = 0, binding = 0) uniform samplerBuffer x;
#else
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
#endif
#ifdef TEXELS
layout(set = 0, binding = 1) uniform samplerBuffer wt;
#define WT_AT(i) texelFetch(wt, int(i)).x
#else
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
#define WT_AT(i) wt[i]
#endif
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };

#include "conv_push.glsl"
#include "f16.glsl"

#ifdef RGB_INPUT
// Where row iy of channel ci of image b starts, and its value at column ix.
#define ROW_AT(b, ci, iy) ((b) * pc.record_stride + (iy) * pc.w * 3u + (ci))
float input_at(uint row, uint ix) {
    uint at = row + 3u * (pc.flip != 0u ? pc.w - 1u - ix : ix);
#ifdef TEXELS
    return float(texelFetch(records, int(at)).x) / 255.0;
#else
    return float((words[at >> 2] >> ((at & 3u) * 8u)) & 0xffu) / 255.0;
#endif
}
#else
#define ROW_AT(b, ci, iy) (((b) * pc.c_in + grp * cig + (ci)) * plane_in + (iy) * pc.w)
#ifdef TEXELS
#define input_at(row, ix) texelFetch(x, int((row) + (ix))).x
#else
#define input_at(row, ix) x[(row) + (ix)]
#endif
#endif

void main() {
    uint grp = gl_WorkGroupID.z;
    uint cig = pc.c_in / pc.groups;
    uint cog = pc.c_out / pc.groups;
    uint taps = pc.k * pc.k;
    uint red = cig * taps;
    uint plane_in = pc.h * pc.w;
    uint plane_out = pc.out_h * pc.out_w;
    uint o0 = gl_WorkGroupID.y * OCB;
    // Output channels of this row that exist (uniform): rows past cog reuse the last one.
    uint rows = min(OCB, cog - o0);
    uint quads = (pc.out_w + PX - 1u) / PX;
    uint at = gl_GlobalInvocationID.x;
    if (at >= pc.n * pc.out_h * quads) {
        return;
    }
    uint row = at / quads; // b·out_h + oy
    uint ox0 = (at - row * quads) * PX;
    uint b = row / pc.out_h;
    uint oy = row - b * pc.out_h;
    int iy0 = int(oy * pc.stride) - int(pc.pad);
    int ix0 = int(ox0 * pc.stride) - int(pc.pad);
    uint w_base = (grp * cog + o0) * red;
    float acc[PX][OCB];
    for (uint q = 0u; q < PX; q++) {
        for (uint j = 0u; j < OCB; j++) {
            acc[q][j] = 0.0;
        }
    }
    for (uint ci = 0u; ci < cig; ci++) {
        for (uint ky = 0u; ky < pc.k; ky++) {
            int iy = iy0 + int(ky);
            // A negative coordinate becomes a huge uint: one comparison per axis.
            bool row_in = uint(iy) < pc.h;
            uint x_row = ROW_AT(b, ci, uint(iy));
            for (uint kx = 0u; kx < pc.k; kx++) {
                OPERAND v[PX];
                for (uint q = 0u; q < PX; q++) {
                    int ix = ix0 + int(q * pc.stride + kx);
                    v[q] = OPERAND((row_in && uint(ix) < pc.w) ? input_at(x_row, uint(ix)) : 0.0);
                }
                uint r = (ci * pc.k + ky) * pc.k + kx;
                for (uint j = 0u; j < OCB; j++) {
                    OPERAND wv = OPERAND(WT_AT(w_base + min(j, rows - 1u) * red + r));
                    for (uint q = 0u; q < PX; q++) {
                        acc[q][j] += float(wv * v[q]);
                    }
                }
            }
        }
    }
    for (uint j = 0u; j < rows; j++) {
        uint o = grp * cog + o0 + j;
        uint out_row = ((b * pc.c_out + o) * pc.out_h + oy) * pc.out_w;
        for (uint q = 0u; q < PX; q++) {
            if (ox0 + q < pc.out_w) {
                float v = acc[q][j] + bias[o];
                if (pc.relu != 0u) {
                    v = max(v, 0.0);
                }
                y[out_row + ox0 + q] = v;
            }
        }
    }
}
