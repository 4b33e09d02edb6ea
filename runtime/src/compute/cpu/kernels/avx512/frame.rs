//! The frame pass's vertical windows in AVX-512.

use super::super::portable;
use std::arch::x86_64::{
    __m512, _mm512_cvtepi32_ps, _mm512_cvtepu8_epi32, _mm512_fmadd_ps, _mm512_mul_ps,
    _mm512_set1_ps, _mm512_storeu_ps, _mm_loadu_si128,
};

/// Sixteen bytes at `p` as sixteen floats.
///
/// # Safety
/// AVX-512F runs here and `p .. p + 16` is readable.
#[inline(always)]
unsafe fn bytes16(p: *const u8) -> __m512 {
    // SAFETY: the caller's.
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))) }
}

/// See [`super::super::WeightedRows`] (and its safety). 64 columns at a time in four
/// registers held across the window's rows, then 16 at a time, the last few by the portable
/// loop.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn weighted_rows(
    src: &[u8],
    stride: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    let n = out.len();
    let (p, o) = (src.as_ptr(), out.as_mut_ptr());
    let w0 = _mm512_set1_ps(weights[0]);
    let mut x = 0;
    // SAFETY (all blocks): columns x .. x + 64 (or + 16) are < n, and row t's bytes
    // t·stride + x .. + 64 lie inside `src` by the contract; `out` holds n floats.
    while x + 64 <= n {
        unsafe {
            let mut a = [0, 16, 32, 48].map(|c| _mm512_mul_ps(bytes16(p.add(x + c)), w0));
            for (t, &w) in weights.iter().enumerate().skip(1) {
                if w == 0.0 {
                    continue;
                }
                let (wv, q) = (_mm512_set1_ps(w), p.add(t * stride + x));
                for (k, acc) in a.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(bytes16(q.add(16 * k)), wv, *acc);
                }
            }
            for (k, acc) in a.iter().enumerate() {
                _mm512_storeu_ps(o.add(x + 16 * k), *acc);
            }
        }
        x += 64;
    }
    while x + 16 <= n {
        unsafe {
            let mut acc = _mm512_mul_ps(bytes16(p.add(x)), w0);
            for (t, &w) in weights.iter().enumerate().skip(1) {
                if w != 0.0 {
                    acc = _mm512_fmadd_ps(bytes16(p.add(t * stride + x)), _mm512_set1_ps(w), acc);
                }
            }
            _mm512_storeu_ps(o.add(x), acc);
        }
        x += 16;
    }
    if x < n {
        // SAFETY: the same rows from column x: (len − 1)·stride + (n − x) ≤ src.len() − x.
        unsafe { portable::weighted_rows(&src[x..], stride, weights, &mut out[x..]) };
    }
}
