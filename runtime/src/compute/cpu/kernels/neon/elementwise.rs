//! The elementwise loops in NEON.

use super::super::portable;
use std::arch::aarch64::{
    float32x4_t, vcvtq_f32_u32, vdupq_n_f32, vextq_f32, vfmaq_f32, vfmsq_f32, vget_high_u16,
    vget_low_u16, vld3_u8, vmovl_u16, vmovl_u8, vmulq_f32, vrev64q_f32, vst1q_f32,
};

/// See [`super::super::RgbRow`] (and its safety). Eight pixels at a time: `ld3` splits their
/// 24 bytes into the three channels. The division by 255 is the AVX2 kernel's: a product by
/// the inverse corrected once by the residual, the same float for every byte.
pub(super) unsafe fn rgb_row(src: &[u8], flip: bool, dst: [&mut [f32]; 3]) {
    let w = src.len() / 3;
    let w8 = w - w % 8;
    let mut rows = dst;
    // SAFETY: NEON is baseline; pixels x .. x + 8 are bytes 3x .. 3x + 24 ≤ 3w of `src`, and
    // each row of `dst` holds w ≥ x + 8 floats (the contract), so columns x .. x + 8 and,
    // mirrored, w − x − 8 .. w − x are inside it.
    unsafe {
        let (scale, inverse) = (vdupq_n_f32(255.0), vdupq_n_f32(1.0 / 255.0));
        // x / 255: q = x·(1/255), then q + (x − q·255)·(1/255), both fused.
        let div = |x: float32x4_t| {
            let q = vmulq_f32(x, inverse);
            vfmaq_f32(q, vfmsq_f32(x, q, scale), inverse)
        };
        let reverse = |v: float32x4_t| {
            let r = vrev64q_f32(v);
            vextq_f32::<2>(r, r)
        };
        for x in (0..w8).step_by(8) {
            let px = vld3_u8(src.as_ptr().add(3 * x));
            for (row, bytes) in rows.iter_mut().zip([px.0, px.1, px.2]) {
                let wide = vmovl_u8(bytes);
                let lo = div(vcvtq_f32_u32(vmovl_u16(vget_low_u16(wide))));
                let hi = div(vcvtq_f32_u32(vmovl_u16(vget_high_u16(wide))));
                let ptr = row.as_mut_ptr();
                if flip {
                    vst1q_f32(ptr.add(w - x - 8), reverse(hi));
                    vst1q_f32(ptr.add(w - x - 4), reverse(lo));
                } else {
                    vst1q_f32(ptr.add(x), lo);
                    vst1q_f32(ptr.add(x + 4), hi);
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
