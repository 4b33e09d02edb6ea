// A tiled matrix product C[m][n] = Σ_k A[m][k]·B[k][n] over one GEMM_BM × GEMM_BN tile,
// shared by the convolution kernels (implicit GEMM: no im2col buffer is ever written).
//
// The tile is sized per shape by specialisation constants 30 and 31 (GEMM_BM: 16, 32 or 64;
// GEMM_BN: 16, 32, 64 or 128; default 32 × 64; kernels.rs: GEMM_TILE_IDS, chosen by
// lower.rs: gemm_tile): small layers get small tiles, so a GPU has workgroups to fill it with
// and no tile is mostly padding; large ones the default. Larger tiles, which reuse each load
// more, are for A/B runs (FULCRUM_VULKAN_GEMM_TILE).
// 256 invocations (16 × 16); thread (tx, ty) ends with rows m0 + ty + 16·i (i < GEMM_TM) and
// columns n0 + tx + 16·j (j < GEMM_TN) of the tile in acc, a register tile of up to 4 × 8.
// Each step loads a GEMM_BK-deep slice of A and B into shared memory. In those loads an
// invocation always reads the same B column (n0 + tid % GEMM_BN, which divides 256) and the
// same depth of A (k0 + tid % 16), so the kernels decompose those
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
// Shared memory: (16·GEMM_BM + 16·GEMM_BN)·4, at most 12 KiB (64 × 128), plus the kernel's
// tables, within the weakest target (kernels.rs). The k bounds are uniform, so every barrier
// is too.

layout(constant_id = 30) const uint GEMM_BM = 32u;
layout(constant_id = 31) const uint GEMM_BN = 64u;
#define GEMM_BK 16u
const uint GEMM_TM = GEMM_BM / 16u;
const uint GEMM_TN = GEMM_BN / 16u;

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
float acc[GEMM_TM][GEMM_TN];
float row_sum[GEMM_TM];

void gemm_tile(uint m0, uint n0, uint k_begin, uint k_end) {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    for (uint i = 0u; i < GEMM_TM; i++) {
        row_sum[i] = 0.0;
        for (uint j = 0u; j < GEMM_TN; j++) {
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
        // A: 16·GEMM_BM values, GEMM_TM per invocation, at depth k0 + a_kk.
        uint ka = k0 + a_kk;
        for (uint e = tid; e < GEMM_BM * GEMM_BK; e += 256u) {
            uint mm = e / GEMM_BK;
            uint m = m0 + mm;
            gemm_as[a_kk * GEMM_BM + mm] = GEMM_T((m < gemm_m && ka < k_end) ? load_a(m, a_kk, ka) : 0.0);
        }
        // B: 16·GEMM_BN values, GEMM_TN per invocation, in column b_n.
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
            GEMM_T a[GEMM_TM];
            for (uint i = 0u; i < GEMM_TM; i++) {
                a[i] = gemm_as[kk * GEMM_BM + ty + 16u * i];
#ifdef GEMM_ROW_SUMS
                row_sum[i] += float(a[i]);
#endif
            }
            for (uint j = 0u; j < GEMM_TN; j++) {
                GEMM_T b = gemm_bs[kk * GEMM_BN + tx + 16u * j];
                for (uint i = 0u; i < GEMM_TM; i++) {
                    acc[i][j] += float(a[i] * b);
                }
            }
        }
        barrier();
        slot ^= 1u;
    }
}
