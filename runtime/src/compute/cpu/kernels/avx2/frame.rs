//! The frame pass's vertical windows in AVX2.

use super::super::portable;
use std::arch::x86_64::{
    __m256, __m256i, _mm256_add_epi32, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32, _mm256_fmadd_ps,
    _mm256_i32gather_ps, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_mul_ps, _mm256_mullo_epi32,
    _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps, _mm_loadl_epi64,
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

/// See [`super::super::GatherTaps`] (and its safety): eight outputs at a time, each tap one
/// gather of their eight samples and one multiply-add; the last few outputs one by one.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(in super::super) unsafe fn gather_taps(
    v: &[f32],
    starts: &[u32],
    weights: &[f32],
    dst: usize,
    taps: usize,
    step: usize,
    offset: isize,
    out: &mut [f32],
) {
    let n = out.len();
    let (stepv, offv) = (
        _mm256_set1_epi32(step as i32),
        _mm256_set1_epi32(offset as i32),
    );
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: outputs i .. i + 8 < n ≤ dst ≤ starts.len(); tap t's weights at t·dst + i
        // .. + 8 ≤ taps·dst; every gathered index lies inside `v` (the contract).
        unsafe {
            let s = _mm256_loadu_si256(starts.as_ptr().add(i).cast::<__m256i>());
            let mut at = _mm256_add_epi32(_mm256_mullo_epi32(s, stepv), offv);
            let mut acc = _mm256_setzero_ps();
            for t in 0..taps {
                let w = _mm256_loadu_ps(weights.as_ptr().add(t * dst + i));
                acc = _mm256_fmadd_ps(w, _mm256_i32gather_ps::<4>(v.as_ptr(), at), acc);
                at = _mm256_add_epi32(at, stepv);
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(i), acc);
        }
        i += 8;
    }
    for (k, o) in out.iter_mut().enumerate().skip(i) {
        let first = (starts[k] as usize * step).wrapping_add_signed(offset);
        *o = (0..taps).fold(0.0, |acc, t| {
            weights[t * dst + k].mul_add(v[first + t * step], acc)
        });
    }
}
