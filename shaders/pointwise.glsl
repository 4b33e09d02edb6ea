// The pointwise kernel's body, shared by pointwise.comp (f32 arithmetic) and pointwise_f16.comp
// (the GEMM's products in f16 where the device offers shaderFloat16; F16 defined).
// pointwise: y = relu?(W·x + b) for a 1×1, stride-1, unpadded, one-group convolution
// (ops::ConvKind::Pointwise), a tiled matrix product per image:
//     Y[o][p] = Σ_c W[o][c] · X[c][p]
// (M = c_out, N = h·w, K = c_in) through shared-memory tiles (gemm.glsl): every loaded
// input value is used by 32 output channels and every weight by 64 pixels. Bias and ReLU
// are fused into the store, and a residual add where the lowering folds one in (pc.skip:
// y = relu?(W·x + b) + skip, the add's own dispatch and pass over memory saved).
//
// Grid: (⌈N/GEMM_BN⌉, ⌈M/GEMM_BM⌉, n).

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) readonly buffer Skip { float skip[]; };

#include "conv_push.glsl"
#include "gemm.glsl"
#include "pointwise_store.glsl"

uint x_base; // this image's input
uint col;    // this invocation's B column (pixel)

void gemm_column(uint p) {
    col = p;
}

void gemm_prepare(uint slot, uint i, uint k) {
}

float load_a(uint m, uint kk, uint c) {
    return wt[m * pc.c_in + c];
}

float load_b(uint kk, uint c) {
    return x[x_base + c * pc.h * pc.w + col];
}

void main() {
    uint img = gl_WorkGroupID.z;
    uint plane = pc.h * pc.w;
    x_base = img * pc.c_in * plane;
    gemm_m = pc.c_out;
    gemm_n = plane;
    uint m0 = gl_WorkGroupID.y * GEMM_BM;
    uint n0 = gl_WorkGroupID.x * GEMM_BN;
    gemm_tile(m0, n0, 0u, pc.c_in);
    for (uint i = 0u; i < GEMM_TM; i++) {
        uint o = m0 + gl_LocalInvocationID.y + 16u * i;
        if (o >= pc.c_out) {
            continue;
        }
        float b = bias[o];
        for (uint j = 0u; j < GEMM_TN; j++) {
            uint p = n0 + gl_LocalInvocationID.x + 16u * j;
            if (p < plane) {
                store_output((img * pc.c_out + o) * plane + p, acc[i][j] + b);
            }
        }
    }
}
