//! The loop over the output rows of a pad-1 3×3 depthwise plane read in place
//! ([`super::Dw3x3InPlace`]), shared by the SIMD sets: a set brings the vectorised columns of
//! a row, this module the rows' pointers, which of them exist, and the scalar tail.

/// Where one output row reads: input rows above, at and below it. `top` and `bottom` are false
/// where that row lies past the plane's edge; its pointer must not be read then.
#[derive(Clone, Copy)]
pub(super) struct RowTaps {
    pub rows: [*const f32; 3],
    pub top: bool,
    pub bottom: bool,
}

/// Every output row in `out`, rows `oy0 ..` of the `oh × ow` plane (`band = (oy0, oh)`;
/// input `x`, `stride·oh × stride·ow`): `vector(taps, o, n)` writes its first
/// `n = ow − ow % lanes` columns through `o`, then the rest are summed here in scalar.
/// `vector` may rely on the present rows being `stride·ow` floats and `o` pointing at `ow`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn rows(
    x: &[f32],
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
    (oy0, oh): (usize, usize),
    stride: usize,
    lanes: usize,
    mut vector: impl FnMut(RowTaps, *mut f32, usize),
) {
    let (ih, iw) = (stride * oh, stride * ow);
    assert!(x.len() >= ih * iw, "input plane too short");
    assert!(oy0 + out.len() / ow <= oh, "rows past the plane");
    let n = ow - ow % lanes;
    let xp = x.as_ptr();
    for (oy, o) in (oy0..).zip(out.chunks_exact_mut(ow)) {
        let iy = stride * oy;
        let taps = RowTaps {
            rows: [iy.wrapping_sub(1), iy, iy + 1].map(|r| xp.wrapping_add(r.wrapping_mul(iw))),
            top: iy > 0,
            bottom: iy + 1 < ih,
        };
        vector(taps, o.as_mut_ptr(), n);
        if n < ow {
            let row = |r: usize| Some(&x[r * iw..][..iw]);
            let rows = [
                iy.checked_sub(1).and_then(row),
                row(iy),
                taps.bottom.then(|| row(iy + 1)).flatten(),
            ];
            pixels(&rows, stride, w, bias, relu, o, n..ow);
        }
    }
}

/// Columns `cols` of one output row from its input rows above, at and below (`None` past the
/// plane's edge), output column `i` reading input columns `stride·i − 1 ..= stride·i + 1`.
#[inline(always)]
fn pixels(
    rows: &[Option<&[f32]>; 3],
    stride: usize,
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    cols: std::ops::Range<usize>,
) {
    for i in cols {
        let mut a = bias;
        for (ky, row) in rows.iter().enumerate() {
            let Some(r) = row else { continue };
            for kx in 0..3 {
                if let Some(&v) = (stride * i + kx).checked_sub(1).and_then(|ix| r.get(ix)) {
                    a += w[3 * ky + kx] * v;
                }
            }
        }
        out[i] = if relu { a.max(0.0) } else { a };
    }
}
