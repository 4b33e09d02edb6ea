//! The elementwise loops in AVX2.

use super::super::portable;
use std::arch::x86_64::{
    __m128i, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32, _mm256_fmadd_ps, _mm256_fnmadd_ps,
    _mm256_mul_ps, _mm256_permutevar8x32_ps, _mm256_set1_ps, _mm256_setr_epi32, _mm256_storeu_ps,
    _mm_loadu_si128, _mm_or_si128, _mm_setr_epi8, _mm_shuffle_epi8,
};

/// See [`super::super::RgbRow`] (and its safety). Eight pixels at a time: two overlapping
/// 16-byte loads cover their 24 bytes, and one byte shuffle of each gathers a channel. The
/// division by 255 is a product by its inverse corrected once by the residual (`x − q·255`,
/// exact in an FMA): the same float as the division for every byte (the kernel test checks
/// all 256), where three divisions every eight pixels had held the divider busy for most of
/// the row (det-s's forward on one thread: 4 % of its time).
#[target_feature(enable = "avx2,fma")]
pub(in super::super) unsafe fn rgb_row(src: &[u8], flip: bool, dst: [&mut [f32]; 3]) {
    let w = src.len() / 3;
    let w8 = w - w % 8;
    // Channel c of pixel i is byte 3i + c: in the first load while 3i + c < 16, else byte
    // 3i + c − 8 of the second. -1 (0x80) zeroes a lane.
    let pick = |c: i8, from_first: bool| {
        let b: [i8; 8] = std::array::from_fn(|i| {
            let at = 3 * i as i8 + c;
            match (from_first, at < 16) {
                (true, true) => at,
                (false, false) => at - 8,
                _ => -1,
            }
        });
        _mm_setr_epi8(
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], -1, -1, -1, -1, -1, -1, -1, -1,
        )
    };
    let masks: [(__m128i, __m128i); 3] = [0, 1, 2].map(|c| (pick(c, true), pick(c, false)));
    let (scale, inverse) = (_mm256_set1_ps(255.0), _mm256_set1_ps(1.0 / 255.0));
    let reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    let mut rows = dst;
    for x in (0..w8).step_by(8) {
        // SAFETY: pixels x .. x + 8 are bytes 3x .. 3x + 24 ≤ 3w of `src`; each row of `dst`
        // holds w ≥ x + 8 floats (the contract), so columns x .. x + 8 and, mirrored,
        // w − x − 8 .. w − x are inside it.
        unsafe {
            let p = src.as_ptr().add(3 * x);
            let (lo, hi) = (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(8).cast()));
            for (row, (ml, mh)) in rows.iter_mut().zip(&masks) {
                let bytes = _mm_or_si128(_mm_shuffle_epi8(lo, *ml), _mm_shuffle_epi8(hi, *mh));
                let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                let q = _mm256_mul_ps(f, inverse);
                let v = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, scale, f), inverse, q);
                let ptr = row.as_mut_ptr();
                if flip {
                    _mm256_storeu_ps(ptr.add(w - x - 8), _mm256_permutevar8x32_ps(v, reverse));
                } else {
                    _mm256_storeu_ps(ptr.add(x), v);
                }
            }
        }
    }
    if w8 < w {
        let tails = rows.map(|row| {
            if flip {
                &mut row[..w - w8]
            } else {
                &mut row[w8..]
            }
        });
        // SAFETY: the portable kernel's contract: 3·(w − w8) bytes for rows of w − w8.
        unsafe { portable::rgb_row(&src[3 * w8..], flip, tails) };
    }
}
