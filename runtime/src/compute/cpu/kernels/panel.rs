//! B's panels for the register-tile GEMMs of the SIMD sets.
//!
//! A column tile's `k × 16` block of B is copied into a contiguous panel (zero-padded past a
//! ragged last column), which stays in L1 while every row set of C passes over it. Read in
//! place, B's rows lie a plane apart — often a multiple of 4 KiB, so they all fall into the
//! same L1 set and every row set would fetch them again.

use super::operands::{Epilogue, Mat};
use super::{Dense3x3Input, RgbRow, RGB_MAX_W};

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

/// One k block of a register-tile GEMM: A from column `k0`, B's packed panel (`kl × 16`), C
/// as a raw pointer so tiles can be written through it. Each SIMD set implements its `tile`.
pub(super) struct RowTiles<'a> {
    pub a: Mat<'a>,
    pub k0: usize,
    pub panel: &'a [f32],
    pub alpha: f32,
    pub beta: f32,
    pub ep: Epilogue<'a>,
    pub c: *mut f32,
    pub ldc: usize,
}

/// The loops around a register tile for `C ← ep(alpha·A·B + beta·C)`: column tiles of 16
/// (B packed per tile), `k` in blocks of [`KC`] (C carrying the partial sums between them),
/// rows in sets of up to `rows`. `tile(t, i, j, w, r)` does rows `i .. i + r`, columns
/// `j .. j + w` of block `t`.
///
/// Where `k` is short, one panel buffer holds several column tiles, packed a row of B at a
/// time: each row is then read as `KC / k` consecutive cache lines instead of one line per
/// row a plane apart, which the prefetcher follows and which does not pile every row into
/// one L1 set (a 32-channel pointwise conv on 32×32 planes: 33 → 25 µs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn drive(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    ep: Epilogue<'_>,
    rows: usize,
    mut tile: impl FnMut(&RowTiles<'_>, usize, usize, usize, usize),
) {
    let mut panel = [0f32; KC * 16];
    // Column tiles per buffer: as many as fit at this k, one where k needs blocks.
    let tiles = if b.cs == 1 { KC / k.clamp(1, KC) } else { 1 };
    for jc in (0..n).step_by(16 * tiles) {
        let cols = (n - jc).min(16 * tiles);
        for k0 in (0..k).step_by(KC) {
            let kl = KC.min(k - k0);
            if tiles == 1 {
                pack_panel(&mut panel, b, k0, kl, jc, cols);
            } else {
                pack_rows(&mut panel, b, k0, kl, jc, cols);
            }
            for (q, j) in (jc..jc + cols).step_by(16).enumerate() {
                let t = RowTiles {
                    a,
                    k0,
                    panel: &panel[q * kl * 16..][..kl * 16],
                    alpha,
                    // Blocks after the first add to what C holds; the last stores the result.
                    beta: if k0 == 0 { beta } else { 1.0 },
                    ep: if k0 + kl == k {
                        ep
                    } else {
                        Epilogue::default()
                    },
                    c,
                    ldc,
                };
                let w = (n - j).min(16);
                for i in (0..m).step_by(rows) {
                    tile(&t, i, j, w, (m - i).min(rows));
                }
            }
        }
    }
}

/// Several column tiles' panels from B with contiguous rows, a row of B at a time: tile `q`
/// (columns `j + 16q ..`) at `panel[q·kl·16 ..]`, zero past column `j + cols`.
#[inline(always)]
fn pack_rows(panel: &mut [f32; KC * 16], b: Mat<'_>, k0: usize, kl: usize, j: usize, cols: usize) {
    let full = cols / 16;
    for p in 0..kl {
        let src = &b.data[(k0 + p) * b.rs + j..][..cols];
        for (q, s) in src.chunks_exact(16).enumerate() {
            let d = &mut panel[(q * kl + p) * 16..][..16];
            d.copy_from_slice(s);
        }
        if !cols.is_multiple_of(16) {
            let d = &mut panel[(full * kl + p) * 16..][..16];
            d[..cols % 16].copy_from_slice(&src[full * 16..]);
            d[cols % 16..].fill(0.0);
        }
    }
}

/// Where input row `iy` of channel `ci` starts: in planes, or in a cache of three rows (each
/// of every channel) that holds row `iy` as its `iy % 3`-th.
#[derive(Clone, Copy)]
struct RowsAt {
    channel: usize,
    row: usize,
    cached: bool,
}

impl RowsAt {
    #[inline(always)]
    fn row(self, ci: usize, iy: usize) -> usize {
        let r = if self.cached { iy % 3 } else { iy };
        ci * self.channel + r * self.row
    }
}

/// The loops of [`super::Dense3x3Half`] around a set's register tile: for each output row in
/// `oys` and 16-column tile, the panel's row `(ci·3 + ky)·3 + kx` gets the input at
/// `(2·oy + ky − 1, 2·(j + q) + kx − 1)` (zero outside the plane and past a ragged tile), then
/// `tile(t, i, j, w, r)` does rows `i .. i + r` of the output over it. An RGB image's three
/// input rows of each output row are first normalised into a cache of float rows by
/// `rgb_row` (the set's own [`super::RgbRow`]); a row shared by two output rows is converted
/// once.
///
/// A set brings `split(row, c, left, dst)`: the three taps (`kx` = 0, 1, 2) of output columns
/// `c .. c + lanes`, from the input row `row` (`2·ow` floats, which it may read from column
/// `2c − 1`, unless `left`: then `c = 0` and column −1 is the zero border, to `2c + 2·lanes −
/// 1`), stored through `dst[kx]` (`lanes` floats each). Columns a whole vector does not cover
/// are filled here.
///
/// Safety (of what the closures are handed): as [`super::Dense3x3Half`]'s contract, which the
/// caller checked; this function asserts it again, cheaply, before any pointer is formed.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn dense3x3_half(
    x: Dense3x3Input<'_>,
    c_in: usize,
    weight: &[f32],
    m: usize,
    ep: Epilogue<'_>,
    out: *mut f32,
    (oh, ow): (usize, usize),
    oys: std::ops::Range<usize>,
    lanes: usize,
    rows: usize,
    rgb_row: RgbRow,
    mut split: impl FnMut(*const f32, usize, bool, [*mut f32; 3]),
    mut tile: impl FnMut(&RowTiles<'_>, usize, usize, usize, usize),
) {
    let kl = c_in * 9;
    assert!(kl <= KC && ow > 0 && m > 0 && oys.end <= oh);
    // The tiles index a residual as C, which here is offset by output row: not supported.
    assert!(ep.residual.is_none(), "dense3x3_half: no residual");
    let (ih, iw) = (2 * oh, 2 * ow);
    assert!(weight.len() >= m * kl);
    let mut panel = [0f32; KC * 16];
    // Output row `oy` from the input rows in `src` (`at` says where).
    let mut out_row = |oy: usize, src: &[f32], at: RowsAt| {
        for j in (0..ow).step_by(16) {
            let wl = (ow - j).min(16);
            for (t, dst) in panel.chunks_exact_mut(3 * 16).take(3 * c_in).enumerate() {
                let (ci, ky) = (t / 3, t % 3);
                let iy = (2 * oy + ky).wrapping_sub(1);
                if iy >= ih {
                    dst.fill(0.0);
                    continue;
                }
                let row = &src[at.row(ci, iy)..][..iw];
                let mut q = 0;
                while q + lanes <= wl {
                    let d = dst.as_mut_ptr();
                    split(
                        row.as_ptr(),
                        j + q,
                        j + q == 0,
                        [0, 16, 32].map(|o| d.wrapping_add(o + q)),
                    );
                    q += lanes;
                }
                for q in q..16 {
                    for kx in 0..3 {
                        let ix = (2 * (j + q) + kx).checked_sub(1);
                        let v = ix.filter(|_| q < wl).and_then(|ix| row.get(ix));
                        dst[16 * kx + q] = v.copied().unwrap_or(0.0);
                    }
                }
            }
            let t = RowTiles {
                a: super::rm(weight, kl),
                k0: 0,
                panel: &panel[..kl * 16],
                alpha: 1.0,
                beta: 0.0,
                ep,
                // Row i of the tile is output plane i, at this output row.
                c: out.wrapping_add(oy * ow),
                ldc: oh * ow,
            };
            for i in (0..m).step_by(rows) {
                tile(&t, i, j, wl, (m - i).min(rows));
            }
        }
    };
    match x {
        Dense3x3Input::Planes(x) => {
            assert!(x.len() >= c_in * ih * iw);
            for oy in oys {
                out_row(
                    oy,
                    x,
                    RowsAt {
                        channel: ih * iw,
                        row: iw,
                        cached: false,
                    },
                );
            }
        }
        Dense3x3Input::Rgb { image, flip } => {
            assert!(c_in == 3 && iw <= RGB_MAX_W && image.len() >= 3 * ih * iw);
            // Input rows `iy` by `iy % 3`, each as three channel rows of `iw` floats.
            let mut cache = [0f32; 9 * RGB_MAX_W];
            let mut held = [usize::MAX; 3];
            for oy in oys {
                for iy in (2 * oy).saturating_sub(1)..(2 * oy + 2).min(ih) {
                    if held[iy % 3] == iy {
                        continue;
                    }
                    let slot = &mut cache[iy % 3 * 3 * iw..][..3 * iw];
                    let (r, gb) = slot.split_at_mut(iw);
                    let (g, b) = gb.split_at_mut(iw);
                    // SAFETY: `rgb_row` is the calling set's own (this runs only inside a
                    // set's `Dense3x3Half`, which runs only where its set does); `3·iw` bytes
                    // for rows of `iw` floats.
                    unsafe { rgb_row(&image[3 * iw * iy..][..3 * iw], flip, [r, g, b]) };
                    held[iy % 3] = iy;
                }
                out_row(
                    oy,
                    &cache,
                    RowsAt {
                        channel: iw,
                        row: 3 * iw,
                        cached: true,
                    },
                );
            }
        }
    }
}
