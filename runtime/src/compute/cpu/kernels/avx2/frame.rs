//! The frame pass's vertical windows in AVX2.

use super::super::portable;
use std::arch::x86_64::{
    __m256, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32, _mm256_fmadd_ps, _mm256_mul_ps,
    _mm256_set1_ps, _mm256_storeu_ps, _mm_loadl_epi64,
};

/// Eight bytes at `p` as eight floats.
///
/// # Safety
/// AVX2 runs here and `p .. p + 8` is readable.
#[inline(always)]
unsafe fn bytes8(p: *const u8) -> __m256 {
    // SAFETY: the caller's.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()))) }
}

/// See [`super::super::WeightedRows`] (and its safety). 32 columns at a time, their four
/// accumulators held in registers across all the window's rows, so each output is stored
/// once; then 8 at a time; the last few by the portable loop.
#[target_feature(enable = "avx2,fma")]
pub(in super::super) unsafe fn weighted_rows(
    src: &[u8],
    stride: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    let n = out.len();
    let (p, o) = (src.as_ptr(), out.as_mut_ptr());
    let w0 = _mm256_set1_ps(weights[0]);
    let mut x = 0;
    // SAFETY (all blocks): columns x .. x + 32 (or + 8) are < n, and row t's bytes
    // t·stride + x .. + 32 lie inside `src` by the contract ((len − 1)·stride + n ≤ src.len());
    // `out` holds n floats.
    while x + 32 <= n {
        unsafe {
            let mut a = [0, 8, 16, 24].map(|c| _mm256_mul_ps(bytes8(p.add(x + c)), w0));
            for (t, &w) in weights.iter().enumerate().skip(1) {
                if w == 0.0 {
                    continue;
                }
                let (wv, q) = (_mm256_set1_ps(w), p.add(t * stride + x));
                for (k, acc) in a.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(bytes8(q.add(8 * k)), wv, *acc);
                }
            }
            for (k, acc) in a.iter().enumerate() {
                _mm256_storeu_ps(o.add(x + 8 * k), *acc);
            }
        }
        x += 32;
    }
    while x + 8 <= n {
        unsafe {
            let mut acc = _mm256_mul_ps(bytes8(p.add(x)), w0);
            for (t, &w) in weights.iter().enumerate().skip(1) {
                if w != 0.0 {
                    acc = _mm256_fmadd_ps(bytes8(p.add(t * stride + x)), _mm256_set1_ps(w), acc);
                }
            }
            _mm256_storeu_ps(o.add(x), acc);
        }
        x += 8;
    }
    if x < n {
        // SAFETY: the same rows from column x: (len − 1)·stride + (n − x) ≤ src.len() − x.
        unsafe { portable::weighted_rows(&src[x..], stride, weights, &mut out[x..]) };
    }
}
