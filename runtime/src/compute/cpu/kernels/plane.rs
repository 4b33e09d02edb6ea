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
    let plane = Plane::new(x, out, ow, (oy0, oh), stride, lanes);
    for (oy, o) in (oy0..).zip(out.chunks_exact_mut(ow)) {
        vector(plane.taps(oy), o.as_mut_ptr(), plane.n);
        plane.tail(w, bias, relu, oy, o);
    }
}

/// Where two output rows `oy` and `oy + 1` of a stride-1 plane read: input rows `oy − 1 ..=
/// oy + 2`. `top` and `bottom` are false where the first or the last lies past the plane's
/// edge; its pointer must not be read then.
#[derive(Clone, Copy)]
pub(super) struct PairTaps {
    pub rows: [*const f32; 4],
    pub top: bool,
    pub bottom: bool,
}

/// As [`rows`] with stride 1, the output rows two at a time where the band has two left:
/// `pair(taps, [o, o_next], n)` writes the first `n` columns of both (the input rows between
/// them are loaded once for both: 12 row loads for two output vectors, not 18), `single`
/// a last odd row as `rows`' `vector` does.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn row_pairs(
    x: &[f32],
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
    (oy0, oh): (usize, usize),
    lanes: usize,
    mut pair: impl FnMut(PairTaps, [*mut f32; 2], usize),
    mut single: impl FnMut(RowTaps, *mut f32, usize),
) {
    let plane = Plane::new(x, out, ow, (oy0, oh), 1, lanes);
    let mut two = out.chunks_exact_mut(2 * ow);
    let mut oy = oy0;
    for o in &mut two {
        let (first, second) = o.split_at_mut(ow);
        let (t, below) = (plane.taps(oy), plane.taps(oy + 1));
        let taps = PairTaps {
            rows: [t.rows[0], t.rows[1], t.rows[2], below.rows[2]],
            top: t.top,
            bottom: below.bottom,
        };
        pair(taps, [first.as_mut_ptr(), second.as_mut_ptr()], plane.n);
        plane.tail(w, bias, relu, oy, first);
        plane.tail(w, bias, relu, oy + 1, second);
        oy += 2;
    }
    let last = two.into_remainder();
    if !last.is_empty() {
        single(plane.taps(oy), last.as_mut_ptr(), plane.n);
        plane.tail(w, bias, relu, oy, last);
    }
}

/// The input plane of [`rows`] and [`row_pairs`], checked against the band they write.
struct Plane<'a> {
    x: &'a [f32],
    /// Input rows and their width.
    ih: usize,
    iw: usize,
    stride: usize,
    /// Columns of an output row the vector kernels write; the rest are summed in scalar.
    n: usize,
    ow: usize,
}

impl<'a> Plane<'a> {
    #[inline(always)]
    fn new(
        x: &'a [f32],
        out: &[f32],
        ow: usize,
        (oy0, oh): (usize, usize),
        stride: usize,
        lanes: usize,
    ) -> Plane<'a> {
        let (ih, iw) = (stride * oh, stride * ow);
        assert!(x.len() >= ih * iw, "input plane too short");
        assert!(oy0 + out.len() / ow <= oh, "rows past the plane");
        Plane {
            x,
            ih,
            iw,
            stride,
            n: ow - ow % lanes,
            ow,
        }
    }

    /// Where output row `oy` reads.
    #[inline(always)]
    fn taps(&self, oy: usize) -> RowTaps {
        let iy = self.stride * oy;
        let xp = self.x.as_ptr();
        RowTaps {
            rows: [iy.wrapping_sub(1), iy, iy + 1]
                .map(|r| xp.wrapping_add(r.wrapping_mul(self.iw))),
            top: iy > 0,
            bottom: iy + 1 < self.ih,
        }
    }

    /// Output row `oy`'s columns past the vector kernels' `n`, in scalar.
    #[inline(always)]
    fn tail(&self, w: &[f32; 9], bias: f32, relu: bool, oy: usize, o: &mut [f32]) {
        if self.n == self.ow {
            return;
        }
        let iy = self.stride * oy;
        let row = |r: usize| Some(&self.x[r * self.iw..][..self.iw]);
        let rows = [
            iy.checked_sub(1).and_then(row),
            row(iy),
            (iy + 1 < self.ih).then(|| row(iy + 1)).flatten(),
        ];
        pixels(&rows, self.stride, w, bias, relu, o, self.n..self.ow);
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
