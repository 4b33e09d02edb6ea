//! The frame pass's vertical windows in AVX-512.

use super::super::portable;
use std::arch::x86_64::{
    __m512, _mm512_add_epi32, _mm512_cvtepi32_ps, _mm512_cvtepu8_epi32, _mm512_fmadd_ps,
    _mm512_i32gather_ps, _mm512_loadu_ps, _mm512_mask_i32gather_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_epi32, _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_mullo_epi32,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps, _mm_loadu_si128,
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

/// See [`super::super::GatherTaps`] (and its safety): sixteen outputs at a time, each tap
/// one gather of their sixteen samples and one multiply-add; the last few under a lane mask.
#[target_feature(enable = "avx512f")]
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
        _mm512_set1_epi32(step as i32),
        _mm512_set1_epi32(offset as i32),
    );
    let mut i = 0;
    while i < n {
        let lanes = (n - i).min(16);
        let mask: u16 = if lanes == 16 {
            u16::MAX
        } else {
            (1 << lanes) - 1
        };
        // SAFETY: the lanes of `mask` are outputs i .. i + lanes ≤ n ≤ dst ≤ starts.len();
        // tap t's weights of them lie at t·dst + i .. < taps·dst; every index a masked-in
        // lane gathers lies inside `v` (the contract); masked-out lanes read and write
        // nothing.
        unsafe {
            let s = _mm512_maskz_loadu_epi32(mask, starts.as_ptr().add(i).cast());
            let mut at = _mm512_add_epi32(_mm512_mullo_epi32(s, stepv), offv);
            let mut acc = _mm512_setzero_ps();
            if lanes == 16 {
                for t in 0..taps {
                    let w = _mm512_loadu_ps(weights.as_ptr().add(t * dst + i));
                    acc = _mm512_fmadd_ps(w, _mm512_i32gather_ps::<4>(at, v.as_ptr()), acc);
                    at = _mm512_add_epi32(at, stepv);
                }
                _mm512_storeu_ps(out.as_mut_ptr().add(i), acc);
            } else {
                for t in 0..taps {
                    let w = _mm512_maskz_loadu_ps(mask, weights.as_ptr().add(t * dst + i));
                    let x = _mm512_mask_i32gather_ps::<4>(acc, mask, at, v.as_ptr());
                    acc = _mm512_fmadd_ps(w, x, acc);
                    at = _mm512_add_epi32(at, stepv);
                }
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, acc);
            }
        }
        i += lanes;
    }
}
