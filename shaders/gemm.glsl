// A tiled matrix product C[m][n] = Σ_k A[m][k]·B[k][n] over one GEMM_BM × GEMM_BN tile,
// shared by the convolution kernels (implicit GEMM: no im2col buffer is ever written).
//
// 256 invocations (16 × 16); thread (tx, ty) ends with rows m0 + ty + 16·i (i < 2) and
// columns n0 + tx + 16·j (j < 4) of the tile in acc. Each step loads a GEMM_BK-deep slice of
// A and B into shared memory. In those loads an invocation always reads the same B column
// (n0 + tid % 64) and the same depth of A (k0 + tid % 16), so the kernels decompose those
// indices once per tile; the depth indices of B change every step, and their decomposition
// (integer divisions, slow on every GPU and worse on CPU SIMD) is done once per step by 16
// invocations into a small shared table, double-buffered so it costs no extra barrier.
//
// A kernel includes this file, then defines (they are declared here):
//     void gemm_column(uint n);                // this invocation's B column (n < gemm_n or not)
//     void gemm_prepare(uint slot, uint i, uint k);  // table entry i of depth k (any k)
//     float load_a(uint m, uint kk, uint k);   // m < gemm_m, k = k0 + kk < k_end
//     float load_b(uint kk, uint k);           // this invocation's column, k = k0 + kk < k_end
// reading the table slot gemm_slot; and sets gemm_m, gemm_n. With GEMM_ROW_SUMS defined,
// row_sum[i] also gets Σ_k A[m][k] for the invocation's rows (a bias gradient).
// Shared memory: (16·32 + 16·64)·4 = 6 KiB plus the kernel's tables, within the weakest
// target (kernels.rs). The k bounds are uniform, so every barrier is too.

#define GEMM_BM 32
#define GEMM_BN 64
#define GEMM_BK 16

layout(local_size_x = 16, local_size_y = 16, local_size_z = 1) in;

// With F16 (f16.glsl) the tiles hold f16 and the products are f16; the sums stay f32.
#include "f16.glsl"
#define GEMM_T OPERAND

shared GEMM_T gemm_as[GEMM_BK * GEMM_BM];
shared GEMM_T gemm_bs[GEMM_BK * GEMM_BN];

uint gemm_m;
uint gemm_n;
uint gemm_slot;

void gemm_column(uint n);
void gemm_prepare(uint slot, uint i, uint k);
float load_a(uint m, uint kk, uint k);
float load_b(uint kk, uint k);
float acc[2][4];
float row_sum[2];

void gemm_tile(uint m0, uint n0, uint k_begin, uint k_end) {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    for (uint i = 0u; i < 2u; i++) {
        row_sum[i] = 0.0;
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    uint b_n = n0 + tid % GEMM_BN;
    bool b_valid = b_n < gemm_n;
    gemm_column(b_n);
    uint a_kk = tid % GEMM_BK;
    if (tid < GEMM_BK) {
        gemm_prepare(0u, tid, k_begin + tid);
    }
    barrier();
    uint slot = 0u;
    for (uint k0 = k_begin; k0 < k_end; k0 += GEMM_BK) {
        gemm_slot = slot;
        // A: 512 values, two per invocation, at depth k0 + a_kk.
        uint ka = k0 + a_kk;
        for (uint e = tid; e < GEMM_BM * GEMM_BK; e += 256u) {
            uint mm = e / GEMM_BK;
            uint m = m0 + mm;
            gemm_as[a_kk * GEMM_BM + mm] = GEMM_T((m < gemm_m && ka < k_end) ? load_a(m, a_kk, ka) : 0.0);
        }
        // B: 1024 values, four per invocation, in column b_n.
        for (uint e = tid; e < GEMM_BK * GEMM_BN; e += 256u) {
            uint kk = e / GEMM_BN;
            uint k = k0 + kk;
            gemm_bs[e] = GEMM_T((b_valid && k < k_end) ? load_b(kk, k) : 0.0);
        }
        // The next step's table, into the other slot (last read before the previous barrier).
        if (tid < GEMM_BK) {
            gemm_prepare(slot ^ 1u, tid, k0 + GEMM_BK + tid);
        }
        barrier();
        for (uint kk = 0u; kk < GEMM_BK; kk++) {
            GEMM_T a0 = gemm_as[kk * GEMM_BM + ty];
            GEMM_T a1 = gemm_as[kk * GEMM_BM + ty + 16u];
#ifdef GEMM_ROW_SUMS
            row_sum[0] += float(a0);
            row_sum[1] += float(a1);
#endif
            for (uint j = 0u; j < 4u; j++) {
                GEMM_T b = gemm_bs[kk * GEMM_BN + tx + 16u * j];
                acc[0][j] += float(a0 * b);
                acc[1][j] += float(a1 * b);
            }
        }
        barrier();
        slot ^= 1u;
    }
}
