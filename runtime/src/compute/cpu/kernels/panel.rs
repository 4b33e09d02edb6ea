//! B's panels for the register-tile GEMMs of the SIMD sets.
//!
//! A column tile's `k × 16` block of B is copied into a contiguous panel (zero-padded past a
//! ragged last column), which stays in L1 while every row set of C passes over it. Read in
//! place, B's rows lie a plane apart — often a multiple of 4 KiB, so they all fall into the
//! same L1 set and every row set would fetch them again.

use super::operands::Mat;

/// Rows of B packed per column tile by the register-tile GEMMs: a `KC × 16` panel (16 KiB, on the
/// stack).
pub(super) const KC: usize = 256;

/// Copies rows `k0 .. k0 + kl`, columns `j .. j + w` of B into `panel` (16 floats a row,
/// zero past `w`). B's rows contiguous: a row at a time. B transposed (its columns
/// contiguous, as Xᵀ in `dW = G·Xᵀ`): a column at a time, which makes the product an
/// outer-product sum with no horizontal additions.
#[inline(always)]
pub(super) fn pack_panel(
    panel: &mut [f32; KC * 16],
    b: Mat<'_>,
    k0: usize,
    kl: usize,
    j: usize,
    w: usize,
) {
    let rows = panel.chunks_exact_mut(16).take(kl);
    if b.cs == 1 {
        for (p, row) in rows.enumerate() {
            let src = &b.data[(k0 + p) * b.rs + j..][..w];
            if let (Ok(d), Ok(s)) = (<&mut [f32; 16]>::try_from(&mut *row), src.try_into()) {
                // A fixed-size copy: inlined, where a slice copy calls memmove.
                *d = *<&[f32; 16]>::clone(&s);
            } else {
                row[..w].copy_from_slice(src);
                row[w..].fill(0.0);
            }
        }
        return;
    }
    if w < 16 {
        rows.for_each(|row| row[w..].fill(0.0));
    }
    for q in 0..w {
        let col = (j + q) * b.cs + k0 * b.rs;
        for p in 0..kl {
            panel[p * 16 + q] = b.data[col + p * b.rs];
        }
    }
}
