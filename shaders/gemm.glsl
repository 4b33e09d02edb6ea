// A tiled matrix product C[m][n] = Σ_k A[m][k]·B[k][n] over one GEMM_BM × GEMM_BN tile,
// shared by the convolution kernels (implicit GEMM: no im2col buffer is ever written).
//
// Before including, a kernel defines
//     float load_a(uint m, uint k);   // only called with m < gemm_m, k in [k_begin, k_end)
//     float load_b(uint k, uint n);   // only called with n < gemm_n, k in [k_begin, k_end)
// and sets the globals gemm_m, gemm_n. gemm_tile(m0, n0, k_begin, k_end) leaves the tile in
// acc: thread (tx, ty) holds rows m0 + ty + 16·i (i < 2), columns n0 + tx + 16·j (j < 4).
// 256 invocations (16 × 16) and (16·32 + 16·64)·4 = 6 KiB of shared memory: within the
// weakest target (kernels.rs). The k bounds are uniform, so every barrier is too.

#define GEMM_BM 32
#define GEMM_BN 64
#define GEMM_BK 16

layout(local_size_x = 16, local_size_y = 16, local_size_z = 1) in;

shared float gemm_as[GEMM_BK * GEMM_BM];
shared float gemm_bs[GEMM_BK * GEMM_BN];

uint gemm_m;
uint gemm_n;
float acc[2][4];

void gemm_tile(uint m0, uint n0, uint k_begin, uint k_end) {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    for (uint i = 0u; i < 2u; i++) {
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint k0 = k_begin; k0 < k_end; k0 += GEMM_BK) {
        // A: 512 values, two per invocation, consecutive invocations along k.
        for (uint e = tid; e < GEMM_BM * GEMM_BK; e += 256u) {
            uint mm = e / GEMM_BK;
            uint kk = e % GEMM_BK;
            uint m = m0 + mm;
            uint k = k0 + kk;
            gemm_as[kk * GEMM_BM + mm] = (m < gemm_m && k < k_end) ? load_a(m, k) : 0.0;
        }
        // B: 1024 values, four per invocation, consecutive invocations along n.
        for (uint e = tid; e < GEMM_BK * GEMM_BN; e += 256u) {
            uint kk = e / GEMM_BN;
            uint nn = e % GEMM_BN;
            uint n = n0 + nn;
            uint k = k0 + kk;
            gemm_bs[e] = (n < gemm_n && k < k_end) ? load_b(k, n) : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < GEMM_BK; kk++) {
            float a0 = gemm_as[kk * GEMM_BM + ty];
            float a1 = gemm_as[kk * GEMM_BM + ty + 16u];
            for (uint j = 0u; j < 4u; j++) {
                float b = gemm_bs[kk * GEMM_BN + tx + 16u * j];
                acc[0][j] += a0 * b;
                acc[1][j] += a1 * b;
            }
        }
        barrier();
    }
}
