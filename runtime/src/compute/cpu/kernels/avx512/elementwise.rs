//! The elementwise loops in AVX-512.

use super::super::avx2;
use std::arch::x86_64::{
    __m512i, _mm512_cvtepi32_ps, _mm512_cvtepu8_epi32, _mm512_fmadd_ps, _mm512_fnmadd_ps,
    _mm512_loadu_si512, _mm512_mul_ps, _mm512_permutex2var_ps, _mm512_set1_ps, _mm512_storeu_ps,
    _mm_loadu_si128,
};

/// Lane indices for [`rgb_row`]'s two permutations that gather channel `c` of 16 pixels
/// from their 48 values in three registers (`v0`, `v1`, `v2`, value `3i + c` of pixel `i`),
/// pixel `i` to lane `i` or, with `flip`, `15 − i`. The first takes pixels 0–10 from `v0`
/// and `v1` (lanes 16 and up name `v1`'s); the second keeps those (from its first operand)
/// and takes pixels 11–15 from `v2` (lanes 16 and up).
const fn gather(c: usize, flip: bool) -> [[i32; 16]; 2] {
    let (mut first, mut second) = ([0i32; 16], [0i32; 16]);
    let mut i = 0;
    while i < 16 {
        let lane = if flip { 15 - i } else { i };
        let at = 3 * i + c;
        if at < 32 {
            first[lane] = at as i32;
            second[lane] = lane as i32;
        } else {
            second[lane] = (16 + at - 32) as i32;
        }
        i += 1;
    }
    [first, second]
}

/// [`gather`]'s indices for each channel, unmirrored and mirrored: worked out at compile time
/// rather than for every row.
static PICKS: [[[[i32; 16]; 2]; 3]; 2] = [
    [gather(0, false), gather(1, false), gather(2, false)],
    [gather(0, true), gather(1, true), gather(2, true)],
];

/// See [`super::super::RgbRow`] (and its safety). Sixteen pixels at a time: their 48 bytes
/// widened to floats and normalised as they lie (the same product and FMA correction as the
/// AVX2 row: the same float as `x / 255` for every byte), then each channel gathered by two
/// lane permutations, the mirroring of `flip` folded into them. The AVX2 row spends six byte
/// shuffles and three widenings on eight pixels, all on one port; this spends six
/// permutations and three widenings on sixteen: det-s's forward pass took 0.98× the time
/// with it on one Sapphire Rapids core, 0.99× on two (`bench compute --ab`, the AVX2 row as
/// variant B). The last `w mod 16` pixels are the AVX2 row's.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn rgb_row(src: &[u8], flip: bool, dst: [&mut [f32]; 3]) {
    let w = src.len() / 3;
    let w16 = w - w % 16;
    let picks: [[__m512i; 2]; 3] = PICKS[usize::from(flip)].map(|channel| {
        // SAFETY: 16 i32s are 64 bytes, read unaligned.
        channel.map(|ix| unsafe { _mm512_loadu_si512(ix.as_ptr().cast()) })
    });
    let (scale, inverse) = (_mm512_set1_ps(255.0), _mm512_set1_ps(1.0 / 255.0));
    let mut rows = dst;
    for x in (0..w16).step_by(16) {
        // SAFETY: pixels x .. x + 16 are bytes 3x .. 3x + 48 ≤ 3w of `src`; each row of `dst`
        // holds w ≥ x + 16 floats (the contract), so columns x .. x + 16 and, mirrored,
        // w − x − 16 .. w − x are inside it.
        unsafe {
            let p = src.as_ptr().add(3 * x);
            let v = [0, 16, 32].map(|o| {
                let f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(o).cast())));
                let q = _mm512_mul_ps(f, inverse);
                _mm512_fmadd_ps(_mm512_fnmadd_ps(q, scale, f), inverse, q)
            });
            let at = if flip { w - x - 16 } else { x };
            for (row, [first, second]) in rows.iter_mut().zip(&picks) {
                let t = _mm512_permutex2var_ps(v[0], *first, v[1]);
                _mm512_storeu_ps(
                    row.as_mut_ptr().add(at),
                    _mm512_permutex2var_ps(t, *second, v[2]),
                );
            }
        }
    }
    if w16 < w {
        let tails = rows.map(|row| {
            if flip {
                &mut row[..w - w16]
            } else {
                &mut row[w16..]
            }
        });
        // SAFETY: AVX2 and FMA, as for this function; 3·(w − w16) bytes for rows of
        // w − w16 floats.
        unsafe { avx2::elementwise::rgb_row(&src[3 * w16..], flip, tails) };
    }
}

#[cfg(test)]
mod tests {
    use super::gather;

    /// Applying the two permutations' indices by hand to the 48 values puts channel c of
    /// pixel i in lane i (or 15 − i).
    #[test]
    fn the_gather_indices_pick_each_channel_in_pixel_order() {
        let values: Vec<usize> = (0..48).collect();
        for c in 0..3 {
            for flip in [false, true] {
                let [first, second] = gather(c, flip);
                let t: Vec<usize> = first.iter().map(|&i| values[i as usize]).collect();
                let out: Vec<usize> = second
                    .iter()
                    .map(|&i| {
                        if i < 16 {
                            t[i as usize]
                        } else {
                            values[32 + i as usize - 16]
                        }
                    })
                    .collect();
                let want: Vec<usize> = (0..16)
                    .map(|l| 3 * if flip { 15 - l } else { l } + c)
                    .collect();
                assert_eq!(out, want, "channel {c}, flip {flip}");
            }
        }
    }
}
