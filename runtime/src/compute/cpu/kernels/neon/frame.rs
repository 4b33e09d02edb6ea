//! The frame pass's vertical windows in NEON.

use super::super::portable;
use std::arch::aarch64::{
    float32x4_t, vcvtq_f32_u32, vfmaq_n_f32, vget_high_u16, vget_high_u8, vget_low_u16,
    vget_low_u8, vld1q_u8, vmovl_u16, vmovl_u8, vmulq_n_f32, vst1q_f32,
};

/// Sixteen bytes at `p` as four vectors of four floats.
///
/// # Safety
/// `p .. p + 16` is readable (NEON is baseline on aarch64).
#[inline(always)]
unsafe fn bytes16(p: *const u8) -> [float32x4_t; 4] {
    // SAFETY: the caller's.
    unsafe {
        let b = vld1q_u8(p);
        let (lo, hi) = (vmovl_u8(vget_low_u8(b)), vmovl_u8(vget_high_u8(b)));
        [
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))),
            vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))),
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))),
            vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))),
        ]
    }
}

/// See [`super::super::WeightedRows`] (and its safety). 16 columns at a time in four
/// registers held across the window's rows; the last few by the portable loop.
pub(in super::super) unsafe fn weighted_rows(
    src: &[u8],
    stride: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    let n = out.len();
    let (p, o) = (src.as_ptr(), out.as_mut_ptr());
    let mut x = 0;
    // SAFETY: columns x .. x + 16 are < n, and row t's bytes t·stride + x .. + 16 lie inside
    // `src` by the contract; `out` holds n floats.
    while x + 16 <= n {
        unsafe {
            let mut a = bytes16(p.add(x)).map(|v| vmulq_n_f32(v, weights[0]));
            for (t, &w) in weights.iter().enumerate().skip(1) {
                if w == 0.0 {
                    continue;
                }
                let v = bytes16(p.add(t * stride + x));
                for (acc, v) in a.iter_mut().zip(v) {
                    *acc = vfmaq_n_f32(*acc, v, w);
                }
            }
            for (k, acc) in a.iter().enumerate() {
                vst1q_f32(o.add(x + 4 * k), *acc);
            }
        }
        x += 16;
    }
    if x < n {
        // SAFETY: the same rows from column x: (len − 1)·stride + (n − x) ≤ src.len() − x.
        unsafe { portable::weighted_rows(&src[x..], stride, weights, &mut out[x..]) };
    }
}
