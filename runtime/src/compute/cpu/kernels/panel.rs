//! B's panels for the register-tile GEMMs of the SIMD sets.
//!
//! A column tile's `k × 16` block of B is copied into a contiguous panel (zero-padded past a
//! ragged last column), which stays in L1 while every row set of C passes over it. Read in
//! place, B's rows lie a plane apart — often a multiple of 4 KiB, so they all fall into the
//! same L1 set and every row set would fetch them again.

use super::operands::{Epilogue, Mat};
use super::{rm, tr, Dense3x3Input, RgbRow, RGB_MAX_W};

/// Rows of B packed per column tile by the register-tile GEMMs: a `KC × 16` panel (16 KiB, on the
/// stack).
pub(super) const KC: usize = 256;

/// Copies rows `k0 .. k0 + kl`, columns `j .. j + w` of B into `panel` (16 floats a row,
/// zero past `w`). B's rows contiguous: a row at a time. B transposed (its columns
/// contiguous, as Xᵀ in `dW = G·Xᵀ`): blocks of `N` columns × `N` rows by the set's
/// `transpose` (see [`drive`]), the edges a column at a time; the product is then an
/// outer-product sum with no horizontal additions.
#[inline(always)]
pub(super) fn pack_panel<const N: usize>(
    panel: &mut [f32; KC * 16],
    b: Mat<'_>,
    (k0, kl): (usize, usize),
    (j, w): (usize, usize),
    transpose: &mut impl FnMut([&[f32]; N], &mut [f32]),
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
    // Whole blocks where B's columns are contiguous (rs = 1), the rest element by element.
    let (wb, kb) = if b.rs == 1 {
        (w / N * N, kl / N * N)
    } else {
        (0, 0)
    };
    for q0 in (0..wb).step_by(N) {
        for p0 in (0..kb).step_by(N) {
            let src = std::array::from_fn(|q| &b.data[(j + q0 + q) * b.cs + k0 + p0..][..N]);
            transpose(src, &mut panel[p0 * 16 + q0..][..(N - 1) * 16 + N]);
        }
    }
    for q in 0..w {
        let col = (j + q) * b.cs + k0 * b.rs;
        let done = if q < wb { kb } else { 0 };
        for p in done..kl {
            panel[p * 16 + q] = b.data[col + p * b.rs];
        }
    }
}

/// Where a register tile reads the `kl` rows of B in its k block, 16 floats each (the tile's
/// columns): a packed panel ([`Packed`]) or rows lying anywhere ([`Gathered`]).
pub(super) trait PanelRows: Copy {
    /// How many rows: the block's `kl`.
    fn rows(&self) -> usize;
    /// Where row `p < rows()` starts; 16 floats from there are readable.
    fn row(&self, p: usize) -> *const f32;
}

/// A packed panel: row `p` at `16·p`.
#[derive(Clone, Copy)]
pub(super) struct Packed<'a>(pub &'a [f32]);

impl PanelRows for Packed<'_> {
    #[inline(always)]
    fn rows(&self) -> usize {
        self.0.len() / 16
    }
    #[inline(always)]
    fn row(&self, p: usize) -> *const f32 {
        self.0.as_ptr().wrapping_add(16 * p)
    }
}

/// Rows that lie apart, each `col` floats into a run of its own (whoever builds one vouches
/// that every run holds `col + 16` floats): [`dense3x3_half`]'s input rows, read in place.
#[derive(Clone, Copy)]
pub(super) struct Gathered<'a> {
    pub starts: &'a [*const f32],
    pub col: usize,
}

impl PanelRows for Gathered<'_> {
    #[inline(always)]
    fn rows(&self) -> usize {
        self.starts.len()
    }
    #[inline(always)]
    fn row(&self, p: usize) -> *const f32 {
        self.starts[p].wrapping_add(self.col)
    }
}

/// One k block of a register-tile GEMM: A from column `k0`, B's rows (`kl × 16`, packed
/// unless `P` says otherwise), C as a raw pointer so tiles can be written through it. Each
/// SIMD set implements its `tile`.
pub(super) struct RowTiles<'a, P: PanelRows = Packed<'a>> {
    pub a: Mat<'a>,
    pub k0: usize,
    pub panel: P,
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
/// A set brings `transpose(src, dst)` for a transposed B: `src[q]` holds `N` consecutive
/// floats of B's column `q` (rows `p .. p + N`), and row `p + r` of the block goes to
/// `dst[16·r ..]`, its `N` floats: a transpose in lane shuffles, where a float at a time had
/// made the packing of `dW = G·Xᵀ` the largest part of its GEMM's own instructions (the
/// backward convs of a det-s step ran 5 % fewer instructions with it).
///
/// Where `k` is short, one panel buffer holds several column tiles, packed a row of B at a
/// time: each row is then read as `KC / k` consecutive cache lines instead of one line per
/// row a plane apart, which the prefetcher follows and which does not pile every row into
/// one L1 set (a 32-channel pointwise conv on 32×32 planes: 33 → 25 µs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn drive<const N: usize>(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    ep: Epilogue<'_>,
    rows: usize,
    mut transpose: impl FnMut([&[f32]; N], &mut [f32]),
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
                pack_panel(&mut panel, b, (k0, kl), (jc, cols), &mut transpose);
            } else {
                pack_rows(&mut panel, b, k0, kl, jc, cols);
            }
            for (q, j) in (jc..jc + cols).step_by(16).enumerate() {
                let t = RowTiles {
                    a,
                    k0,
                    panel: Packed(&panel[q * kl * 16..][..kl * 16]),
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
                for (i, r) in row_sets(m, rows) {
                    tile(&t, i, j, w, r);
                }
            }
        }
    }
}

/// Two column tiles' panels side by side (as [`pack_rows`] packs them): row `p` of the first
/// at `16·p`, of the second `16·kl` floats further.
#[derive(Clone, Copy)]
#[cfg(target_arch = "x86_64")]
pub(super) struct PackedPair<'a> {
    pub panels: &'a [f32],
    pub kl: usize,
}

#[cfg(target_arch = "x86_64")]
impl PanelRows for PackedPair<'_> {
    #[inline(always)]
    fn rows(&self) -> usize {
        self.kl
    }
    #[inline(always)]
    fn row(&self, p: usize) -> *const f32 {
        self.panels.as_ptr().wrapping_add(16 * p)
    }
}

/// Rows of B for a tile two registers wide: [`PanelRows`]' rows, and beside each another 16
/// floats.
#[cfg(target_arch = "x86_64")]
pub(super) trait PairRows: PanelRows {
    /// Where the second 16 floats of row `p < rows()` start; 16 floats from there are
    /// readable.
    fn row2(&self, p: usize) -> *const f32;
}

#[cfg(target_arch = "x86_64")]
impl PairRows for PackedPair<'_> {
    #[inline(always)]
    fn row2(&self, p: usize) -> *const f32 {
        self.panels.as_ptr().wrapping_add(16 * (self.kl + p))
    }
}

/// The run's next 16 floats: [`dense3x3_half`] hands a tile wider than 16 columns only where
/// they lie inside the strip.
#[cfg(target_arch = "x86_64")]
impl PairRows for Gathered<'_> {
    #[inline(always)]
    fn row2(&self, p: usize) -> *const f32 {
        self.row(p).wrapping_add(16)
    }
}

/// [`drive`] where B's rows are contiguous and `k` short enough for a buffer to hold several
/// column tiles: the tiles two at a time, `pair(t, i, j, w, r)` with `w ≤ 32` (a last tile of
/// `w ≤ 16` reads only the pair's first panel, [`PackedPair`]'s rows as [`PanelRows`]).
/// Otherwise as [`drive`], with `tile`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub(super) fn drive_pairs<const N: usize>(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    ep: Epilogue<'_>,
    rows: usize,
    transpose: impl FnMut([&[f32]; N], &mut [f32]),
    tile: impl FnMut(&RowTiles<'_>, usize, usize, usize, usize),
    mut pair: impl FnMut(&RowTiles<'_, PackedPair<'_>>, usize, usize, usize, usize),
) {
    let tiles = if b.cs == 1 { KC / k.clamp(1, KC) } else { 1 };
    if tiles < 2 || n <= 16 {
        return drive(
            (m, k, n),
            alpha,
            a,
            b,
            beta,
            c,
            ldc,
            ep,
            rows,
            transpose,
            tile,
        );
    }
    let tiles = tiles / 2 * 2;
    let mut panel = [0f32; KC * 16];
    for jc in (0..n).step_by(16 * tiles) {
        let cols = (n - jc).min(16 * tiles);
        pack_rows(&mut panel, b, 0, k, jc, cols);
        for (q, j) in (jc..jc + cols).step_by(32).enumerate() {
            // A last tile of 16 columns or fewer finds its panel first in the pair.
            let t = RowTiles {
                a,
                k0: 0,
                panel: PackedPair {
                    panels: &panel[2 * q * k * 16..][..2 * k * 16],
                    kl: k,
                },
                alpha,
                beta,
                ep,
                c,
                ldc,
            };
            for (i, r) in row_sets(m, rows) {
                pair(&t, i, j, (n - j).min(32), r);
            }
        }
    }
}

/// C's rows `0 .. m` in as few sets of at most `rows` as cover them, as even as can be
/// (first row, rows): 32 rows in sixes are 6, 6, 5, 5, 5, 5, not five sixes and a two, whose
/// tile would have too few accumulators to hide the FMAs' latency.
pub(super) fn row_sets(m: usize, rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let sets = m.div_ceil(rows.max(1));
    let (base, extra) = (m / sets.max(1), m % sets.max(1));
    (0..sets).map(move |s| (s * base + s.min(extra), base + usize::from(s < extra)))
}

/// `f(r)` for each `r < R` (at most 16), unrolled: a tile's sums indexed by the `r` of a
/// loop the compiler does not unroll (an epilogue too long for it) must lie in memory, and
/// were then stored to the stack at every step of the k loop; with each `r` a constant they
/// stay in registers. Only the x86-64 sets' tiles use it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn each_row<const R: usize>(mut f: impl FnMut(usize)) {
    const { assert!(R <= 16, "each_row unrolls at most 16 rows") };
    macro_rules! rows {
        ($($r:literal)*) => { $(if $r < R { f($r) })* };
    }
    rows!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
}

/// Several column tiles' panels from B with contiguous rows, a row of B at a time: tile `q`
/// (columns `j + 16q ..`) at `panel[q·kl·16 ..]`, zero past column `j + cols`.
#[inline(always)]
fn pack_rows(panel: &mut [f32; KC * 16], b: Mat<'_>, k0: usize, kl: usize, j: usize, cols: usize) {
    let (rows16, _) = panel.as_chunks_mut::<16>();
    // Row p of tile q is row q·kl + p of the panel; checked once here, where an index per row
    // had been two bounds checks per 16 floats copied.
    assert!(
        cols.div_ceil(16) * kl <= rows16.len(),
        "pack_rows: more than a panel"
    );
    for p in 0..kl {
        let src = &b.data[(k0 + p) * b.rs + j..][..cols];
        let (whole, rest) = src.as_chunks::<16>();
        for (q, s) in whole.iter().enumerate() {
            // SAFETY: q < cols / 16 and p < kl, so q·kl + p < cols.div_ceil(16)·kl ≤ the
            // panel's rows (asserted above).
            unsafe { *rows16.get_unchecked_mut(q * kl + p) = *s };
        }
        if !rest.is_empty() {
            let d = &mut rows16[whole.len() * kl + p];
            d[..rest.len()].copy_from_slice(rest);
            d[rest.len()..].fill(0.0);
        }
    }
}

/// Output columns [`dense3x3_half`] covers per strip at most: an RGB image's whole width.
const STRIP_MAX: usize = RGB_MAX_W / 2 + 16;

/// Floats of [`dense3x3_half`]'s cache (29 KiB, on the stack): three input rows of every
/// channel, each split into its even and its odd columns, over a strip of output columns.
const HALF_CACHE: usize = 3 * 3 * 2 * (STRIP_MAX + 16);

/// Most weights (`m · c_in·9`) [`dense3x3_half`] copies into a column-major block (7 KiB on
/// the stack): 64 output channels of an RGB stem.
const COLUMNS_MAX: usize = 64 * 27;

/// The zero rows above the input (pad 1), as long as any run a tile reads.
static ZERO_ROW: [f32; STRIP_MAX + 32] = [0.0; STRIP_MAX + 32];

/// The loops of [`super::Dense3x3Half`] around a set's register tile, with B's rows read in
/// place: each input row a strip of output columns needs is split once into its even
/// columns and its odd ones (in a cache of three rows of every channel), and there B's row
/// for tap `(ci, ky, kx)` is a run of 16 consecutive floats: the even columns for `kx = 1`,
/// the odd ones for `kx = 2` and, one column earlier, for `kx = 0` (the odd run starts with
/// the input column left of the strip, zero at the border). So nothing is copied per output
/// row, where a packed panel would copy 27 runs per 16 output columns. The tiles sum the
/// taps in `(ci, ky, kx)` order, as `im2col` and the GEMM do.
///
/// An RGB image's rows are first normalised by `rgb_row` (the set's own [`RgbRow`]) into a
/// row of floats per channel; its whole width is one strip. Planes are split straight from
/// their rows, in strips as wide as the cache allows for `c_in` channels.
///
/// The weights (A, `m × c_in·9`) are first copied column by column where they fit
/// ([`COLUMNS_MAX`]): a tile's rows at one tap are then consecutive floats, reached through
/// one pointer, which leaves the registers for more rows of C (`rows[1]` at most a tile;
/// `rows[0]` where A stays row-major).
///
/// A set brings `split(src, [even, odd])`: `lanes` output columns, the even floats of the
/// `2·lanes` at `src` to `even`, the odd ones to `odd`. Columns a whole vector does not
/// cover are split here. `tile(t, i, j, w, r)` does rows `i .. i + r`, columns `j .. j + w`
/// of `t`, `w ≤ tile_cols` (16, or 32 for a tile two registers of 16 wide: one wider than 16
/// is handed only where its second 16 columns lie inside the strip, as [`PairRows::row2`]
/// needs).
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
    tile_cols: usize,
    rows: [usize; 2],
    rgb_row: RgbRow,
    mut split: impl FnMut(*const f32, [*mut f32; 2]),
    mut tile: impl FnMut(&RowTiles<'_, Gathered<'_>>, usize, usize, usize, usize),
) {
    let kl = c_in * 9;
    assert!(kl <= KC && ow > 0 && m > 0 && oys.end <= oh);
    // The tiles index a residual as C, which here is offset by output row: not supported.
    assert!(ep.residual.is_none(), "dense3x3_half: no residual");
    let (ih, iw) = (2 * oh, 2 * ow);
    assert!(weight.len() >= m * kl);
    // A channel's row in the cache: `run` even columns, then `run` odd ones, one column later
    // (the first is the column left of the strip); a strip is at most `run − 1` columns, in
    // whole tiles, so a tile's 16 floats from the odd run's second stay inside it.
    let run = HALF_CACHE / (3 * c_in * 2);
    let strip = ((run - 1) / 16 * 16)
        .min(STRIP_MAX)
        .min(ow.next_multiple_of(16));
    assert!(strip >= 16, "{c_in} channels: more than the cache holds");
    let mut cache = [0f32; HALF_CACHE];
    let slot = |iy: usize, ci: usize| (iy % 3 * c_in + ci) * 2 * run;
    // An RGB input row as floats, a channel at a time.
    let mut rgb = [0f32; 3 * RGB_MAX_W];
    let (planes, image) = match x {
        Dense3x3Input::Planes(x) => {
            assert!(x.len() >= c_in * ih * iw);
            (Some(x), None)
        }
        Dense3x3Input::Rgb { image, flip } => {
            assert!(c_in == 3 && iw <= RGB_MAX_W && image.len() >= 3 * ih * iw);
            assert!(strip >= ow, "an RGB image is one strip");
            (None, Some((image, flip)))
        }
    };
    let mut columns = [0f32; COLUMNS_MAX];
    let (a, rows) = if m * kl <= COLUMNS_MAX {
        for (i, w) in weight[..m * kl].chunks_exact(kl).enumerate() {
            for (p, &v) in w.iter().enumerate() {
                columns[p * m + i] = v;
            }
        }
        (tr(&columns[..m * kl], m), rows[1])
    } else {
        (rm(weight, kl), rows[0])
    };
    let mut starts = [std::ptr::null::<f32>(); KC];
    for x0 in (0..ow).step_by(strip) {
        let width = strip.min(ow - x0);
        let mut held = [usize::MAX; 3];
        for oy in oys.clone() {
            for iy in (2 * oy).saturating_sub(1)..(2 * oy + 2).min(ih) {
                if held[iy % 3] == iy {
                    continue;
                }
                held[iy % 3] = iy;
                if let Some((image, flip)) = image {
                    let (r, gb) = rgb[..3 * iw].split_at_mut(iw);
                    let (g, b) = gb.split_at_mut(iw);
                    // SAFETY: `rgb_row` is the calling set's own (this runs only inside a
                    // set's `Dense3x3Half`, which runs only where its set does); `3·iw` bytes
                    // for rows of `iw` floats.
                    unsafe { rgb_row(&image[3 * iw * iy..][..3 * iw], flip, [r, g, b]) };
                }
                for ci in 0..c_in {
                    let src = match planes {
                        Some(x) => &x[(ci * ih + iy) * iw..][..iw],
                        None => &rgb[ci * iw..][..iw],
                    };
                    let (even, odd) = cache[slot(iy, ci)..][..2 * run].split_at_mut(run);
                    odd[0] = if x0 == 0 { 0.0 } else { src[2 * x0 - 1] };
                    // The strip's 2·width input floats (2·(x0 + width) ≤ 2·ow = iw) and
                    // `width` of each run (width ≤ run − 1), cut once: then whole vectors by
                    // chunks, with no bounds check per vector.
                    let src = &src[2 * x0..][..2 * width];
                    let (even, odd) = (&mut even[..width], &mut odd[1..][..width]);
                    let vectors = src.chunks_exact(2 * lanes);
                    let done = width - width % lanes;
                    for ((s, e), o) in vectors
                        .zip(even.chunks_exact_mut(lanes))
                        .zip(odd.chunks_exact_mut(lanes))
                    {
                        split(s.as_ptr(), [e.as_mut_ptr(), o.as_mut_ptr()]);
                    }
                    for t in done..width {
                        even[t] = src[2 * t];
                        odd[t] = src[2 * t + 1];
                    }
                }
            }
            // Tap (ci, ky, kx) is B's row ci·9 + ky·3 + kx: loops over the three, not a
            // division per tap (a tenth of the stem's time had gone to them).
            for ky in 0..3 {
                let iy = (2 * oy + ky).wrapping_sub(1);
                let taps = starts[..kl].chunks_exact_mut(9).enumerate();
                for (ci, start) in taps {
                    let run3 = &mut start[3 * ky..][..3];
                    if iy >= ih {
                        run3.fill(ZERO_ROW.as_ptr());
                    } else {
                        let even = cache[slot(iy, ci)..].as_ptr();
                        // Even run at 0, odd at `run` (from the column left of the strip).
                        run3[0] = even.wrapping_add(run);
                        run3[1] = even;
                        run3[2] = even.wrapping_add(run + 1);
                    }
                }
            }
            for j in (0..width).step_by(tile_cols) {
                let t = RowTiles {
                    a,
                    k0: 0,
                    panel: Gathered {
                        starts: &starts[..kl],
                        col: j,
                    },
                    alpha: 1.0,
                    beta: 0.0,
                    ep,
                    // Row i of the tile is output plane i, at this output row and strip.
                    c: out.wrapping_add(oy * ow + x0),
                    ldc: oh * ow,
                };
                for (i, r) in row_sets(m, rows) {
                    tile(&t, i, j, (width - j).min(tile_cols), r);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::row_sets;

    #[test]
    fn row_sets_cover_every_row_once_in_sets_within_one_of_each_other() {
        for rows in 1..=8 {
            for m in 1..=70 {
                let sets: Vec<_> = row_sets(m, rows).collect();
                assert_eq!(sets.len(), m.div_ceil(rows), "{m} in {rows}s");
                let mut next = 0;
                for &(i, r) in &sets {
                    assert_eq!(i, next, "{m} in {rows}s: {sets:?}");
                    assert!(r >= 1 && r <= rows, "{m} in {rows}s: {sets:?}");
                    next += r;
                }
                assert_eq!(next, m);
                let (lo, hi) = sets
                    .iter()
                    .fold((usize::MAX, 0), |(l, h), &(_, r)| (l.min(r), h.max(r)));
                assert!(hi - lo <= 1, "{m} in {rows}s: {sets:?}");
            }
        }
        assert_eq!(
            row_sets(32, 6).map(|s| s.1).collect::<Vec<_>>(),
            [6, 6, 5, 5, 5, 5]
        );
    }
}
