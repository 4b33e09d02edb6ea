//! The pass itself: the letterbox's placement, the planes and channels of each format, and
//! the row loop (see the module above for the order of work).

use fulcrum_board::protocol::PixelFormat;

use super::colour::{to_rgb, Channels, YuvToRgb};
use super::source::{Pixels, PixelsError, Rect};
use super::window::{Axis, Interval};
use super::PAD_COLOUR;
use crate::compute::cpu::kernels::{self, Kernels};

/// Where the source (or its crop) landed in the letterboxed output.
///
/// The source is scaled by `min(size/w, size/h)`, the scaled size rounded to whole pixels,
/// and centred with integer padding `(size − content) / 2` (the extra pixel of an odd
/// remainder goes right/bottom), the convention of the YOLO family. A source point `(x, y)`
/// (relative to the crop) maps to `(x · scale + pad_x, y · scale + pad_y)`, exactly as the
/// record format documents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Letterbox {
    /// Output pixels per source pixel.
    pub scale: f32,
    /// Left padding in output pixels (a whole number).
    pub pad_x: f32,
    /// Top padding in output pixels (a whole number).
    pub pad_y: f32,
    /// Size of the scaled content in output pixels.
    pub width: u32,
    pub height: u32,
}

impl Letterbox {
    /// Where a `w × h` source lands in a `size × size` output.
    pub fn place(size: u32, w: u32, h: u32) -> Letterbox {
        if w == 0 || h == 0 || size == 0 {
            return Letterbox {
                scale: 0.0,
                pad_x: 0.0,
                pad_y: 0.0,
                width: 0,
                height: 0,
            };
        }
        let scale = (size as f32 / w as f32).min(size as f32 / h as f32);
        let cw = ((w as f32 * scale).round() as u32).clamp(1, size);
        let ch = ((h as f32 * scale).round() as u32).clamp(1, size);
        let (px, py) = ((size - cw) / 2, (size - ch) / 2);
        Letterbox {
            scale,
            pad_x: px as f32,
            pad_y: py as f32,
            width: cw,
            height: ch,
        }
    }
}

/// Some channels of a plane, read across a row: sample `k` of channel `c` is byte
/// `k·step + offsets[c]` of the plane's row.
#[derive(Debug, Clone, Copy)]
struct Grid {
    step: usize,
    offsets: [usize; 3],
    channels: usize,
    /// Chroma of a 4:2:2 or 4:2:0 format: half as many samples as pixels across.
    halved_x: bool,
    /// The first output channel it fills (Y or R 0, U 1, V 2).
    first: usize,
}

/// Rows of bytes of one plane, with the grids read from them.
#[derive(Debug, Clone, Copy)]
struct Plane {
    /// Byte offset of its first row.
    offset: usize,
    /// 4:2:0 chroma: one row per two pixel rows.
    halved_y: bool,
    grids: [Option<Grid>; 2],
}

fn grid(step: usize, offsets: &[usize], halved_x: bool, first: usize) -> Option<Grid> {
    let mut o = [0; 3];
    o[..offsets.len()].copy_from_slice(offsets);
    Some(Grid {
        step,
        offsets: o,
        channels: offsets.len(),
        halved_x,
        first,
    })
}

/// The planes of `format` and what their channels are.
fn layout(src: &Pixels<'_>) -> ([Option<Plane>; 2], Channels) {
    let whole = |g: Option<Grid>| Plane {
        offset: 0,
        halved_y: false,
        grids: [g, None],
    };
    let rgb = |step, order: &[usize]| {
        (
            [Some(whole(grid(step, order, false, 0))), None],
            Channels::Rgb,
        )
    };
    let yuv = Channels::Yuv(YuvToRgb::new(src.colour()));
    match src.format() {
        PixelFormat::Rgb8 => rgb(3, &[0, 1, 2]),
        PixelFormat::Bgr8 => rgb(3, &[2, 1, 0]),
        PixelFormat::Rgba8 => rgb(4, &[0, 1, 2]),
        PixelFormat::Bgra8 => rgb(4, &[2, 1, 0]),
        PixelFormat::Gray8 => ([Some(whole(grid(1, &[0], false, 0))), None], Channels::Gray),
        PixelFormat::Yuyv => (
            [
                Some(Plane {
                    offset: 0,
                    halved_y: false,
                    grids: [grid(2, &[0], false, 0), grid(4, &[1, 3], true, 1)],
                }),
                None,
            ],
            yuv,
        ),
        PixelFormat::Nv12 => (
            [
                Some(whole(grid(1, &[0], false, 0))),
                Some(Plane {
                    offset: src.height() as usize * src.stride(),
                    halved_y: true,
                    grids: [grid(2, &[0, 1], true, 1), None],
                }),
            ],
            yuv,
        ),
    }
}

/// The frame pass with its scratch: sized up front with [`FramePass::with_capacity`], it
/// allocates nothing for sources within that size.
#[derive(Debug)]
pub struct FramePass {
    size: u32,
    kernels: &'static Kernels,
    /// Windows across: pixels, then chroma samples.
    x: [Axis; 2],
    /// Windows down: pixel rows, then 4:2:0 chroma rows.
    y: [Axis; 2],
    /// One output row's vertical sums of a plane's bytes.
    vrow: Vec<f32>,
    /// One output row's three channels.
    channels: Vec<f32>,
}

impl FramePass {
    /// A pass into `size × size` outputs whose scratch grows with the largest source seen.
    pub fn new(size: u32) -> Self {
        Self::with_kernels(size, kernels::active())
    }

    /// A pass whose vertical windows run on the kernel set `set`, where this CPU runs it (for
    /// benchmarks and A/B runs; [`FramePass::new`] takes the process's chosen set).
    pub fn on_kernel_set(size: u32, set: kernels::KernelSet) -> Option<Self> {
        kernels::table(set).map(|k| Self::with_kernels(size, k))
    }

    pub(crate) fn with_kernels(size: u32, kernels: &'static Kernels) -> Self {
        FramePass {
            size,
            kernels,
            x: Default::default(),
            y: Default::default(),
            vrow: Vec::new(),
            channels: Vec::new(),
        }
    }

    /// A pass with scratch for sources up to `max_side` pixels a side.
    pub fn with_capacity(size: u32, max_side: u32) -> Self {
        let mut p = Self::new(size);
        p.reserve(max_side);
        p
    }

    /// The output side, pixels.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The kernel set the vertical pass runs on.
    pub fn kernel_set(&self) -> kernels::KernelSet {
        self.kernels.set
    }

    /// Most taps of a window for sources up to `max_side`: the letterbox keeps the aspect
    /// ratio, and rounding a side to at least one pixel can at most double an axis's shrink
    /// factor, so `2·max_side / size` bounds every axis's.
    fn max_taps(max_side: u32, size: u32) -> usize {
        Axis::taps_for(f64::from(2 * max_side.max(1)), size.max(1))
    }

    /// Grows the scratch for sources up to `max_side` pixels a side.
    pub fn reserve(&mut self, max_side: u32) {
        let (dst, taps) = (
            self.size.max(1) as usize,
            Self::max_taps(max_side, self.size),
        );
        for a in self.x.iter_mut().chain(self.y.iter_mut()) {
            a.reserve(dst, taps);
        }
        grow(&mut self.vrow, max_side.max(1) as usize * 4 + SLACK);
        grow(&mut self.channels, dst * 3);
    }

    /// Bytes [`FramePass::with_capacity`] holds, computed without allocating (for memory
    /// plans).
    pub fn planned_bytes(size: u32, max_side: u32) -> usize {
        let (dst, taps) = (size.max(1) as usize, Self::max_taps(max_side, size));
        4 * Axis::planned_bytes(dst, taps)
            + (max_side.max(1) as usize * 4 + SLACK) * 4
            + dst * 3 * 4
    }

    /// Bytes of scratch held.
    pub fn bytes(&self) -> usize {
        self.x.iter().chain(&self.y).map(Axis::bytes).sum::<usize>()
            + (self.vrow.capacity() + self.channels.capacity()) * 4
    }

    /// Letterboxes `crop` of `src` (all of it for `None`) into `out` (`size × size × 3`
    /// bytes, RGB interleaved). Allocates only for sources beyond what was reserved.
    pub fn run(
        &mut self,
        src: &Pixels<'_>,
        crop: Option<Rect>,
        out: &mut [u8],
    ) -> Result<Letterbox, PixelsError> {
        let n = self.size as usize;
        assert_eq!(
            out.len(),
            n * n * 3,
            "letterbox output must be size × size × 3 bytes"
        );
        let region = src.region(crop)?;
        let placed = Letterbox::place(self.size, region.width, region.height);
        let (dw, dh) = (placed.width as usize, placed.height as usize);
        let (px, py) = (placed.pad_x as usize, placed.pad_y as usize);
        self.reserve(src.width().max(src.height()));

        let (planes, channels) = layout(src);
        let across = Interval::whole(region.x, region.width);
        let down = Interval::whole(region.y, region.height);
        self.x[0].plan(across, placed.width);
        self.y[0].plan(down, placed.height);
        if matches!(src.format(), PixelFormat::Yuyv | PixelFormat::Nv12) {
            self.x[1].plan(across.halved(), placed.width);
        }
        if src.format() == PixelFormat::Nv12 {
            self.y[1].plan(down.halved(), placed.height);
        }

        let row_bytes = n * 3;
        for (y, row) in out.chunks_exact_mut(row_bytes).enumerate() {
            if y < py || y >= py + dh {
                fill_pad(row);
                continue;
            }
            fill_pad(&mut row[..px * 3]);
            fill_pad(&mut row[(px + dw) * 3..]);
            let j = y - py;
            for plane in planes.iter().flatten() {
                self.plane_row(src, plane, j, dw);
            }
            let (a, rest) = self.channels[..3 * n].split_at(n);
            let (b, c) = rest.split_at(n);
            to_rgb(channels, [a, b, c], &mut row[px * 3..(px + dw) * 3]);
        }
        Ok(placed)
    }

    /// Output row `j` of one plane's channels: the vertical sums of its bytes, then each
    /// grid's horizontal windows into [`FramePass::channels`].
    fn plane_row(&mut self, src: &Pixels<'_>, plane: &Plane, j: usize, dw: usize) {
        let n = self.size as usize;
        let x_axis = |g: &Grid| if g.halved_x { 1 } else { 0 };
        // The bytes any window of any grid reads.
        let (mut lo, mut hi) = (usize::MAX, 0);
        for g in plane.grids.iter().flatten() {
            let (s0, s1) = self.x[x_axis(g)].span();
            let offs = &g.offsets[..g.channels];
            lo = lo.min(s0 as usize * g.step + offs.iter().min().unwrap());
            hi = hi.max((s1 as usize - 1) * g.step + offs.iter().max().unwrap() + 1);
        }
        let axis = &self.y[usize::from(plane.halved_y)];
        let (first_row, weights) = axis.window(j);
        let stride = src.stride();
        let start = plane.offset + first_row as usize * stride + lo;
        let len = hi - lo;
        let bytes = src.bytes();
        // The picture was checked to hold every row of every plane in full, and windows lie
        // inside the picture: this holds for every well-formed `Pixels`.
        assert!(
            start + (weights.len() - 1) * stride + len <= bytes.len(),
            "frame pass reads outside the picture"
        );
        let vrow = &mut self.vrow[..len + SLACK];
        // SAFETY: the kernels come from `kernels::table` (only sets this CPU runs); the
        // assertion above is the kernel's bound on `src`, and `weights` is not empty.
        unsafe { (self.kernels.weighted_rows)(&bytes[start..], stride, weights, &mut vrow[..len]) };
        for g in plane.grids.iter().flatten() {
            let axis = &self.x[x_axis(g)];
            let out = &mut self.channels[g.first * n..(g.first + g.channels) * n];
            match g.channels {
                1 => horizontal::<1>(vrow, lo, g, axis, out, dw),
                2 => horizontal::<2>(vrow, lo, g, axis, out, dw),
                _ => horizontal::<3>(vrow, lo, g, axis, out, dw),
            }
        }
    }
}

/// Floats of slack after a row of vertical sums: [`horizontal`] reads four at a time from
/// a grid's first channel, one or more of them past the window's last sample.
const SLACK: usize = 4;

/// The horizontal windows of `C` channels of a grid over one row of vertical sums (`v`,
/// starting at byte `base` of the row, with [`SLACK`] readable floats after its end):
/// channel `c`'s output `i` into `out[c·n + i]`, for the first `dw` outputs.
///
/// A window's samples of every channel are read as one group of four lanes (R G B ·, U · V ·,
/// U V · ·: the offsets of a grid lie within four bytes), one multiply-add a tap for all
/// its channels; a one-channel plane (luma, grey) instead sums four taps at a time.
#[inline(always)]
fn horizontal<const C: usize>(
    v: &[f32],
    base: usize,
    g: &Grid,
    axis: &Axis,
    out: &mut [f32],
    dw: usize,
) {
    let n = out.len() / C;
    let taps = axis.taps();
    // Offsets from the grid's first byte in a window, which is at or after `base`.
    let least = *g.offsets[..C].iter().min().unwrap();
    let lanes: [usize; C] = std::array::from_fn(|c| g.offsets[c] - least);
    debug_assert!(lanes.iter().all(|&l| l < 4));
    let windows = axis.starts().iter().zip(axis.weights().chunks_exact(taps));
    // Every window starts at or after the axis's first sample and ends by its last, so the
    // reads below stay inside `v` when the span's do: checked once here, not per tap.
    let (lo, hi) = axis.span();
    assert!(
        lo as usize * g.step + least >= base
            && (hi as usize - 1) * g.step + least + 4 <= base + v.len(),
        "horizontal windows reach outside the row of sums"
    );
    let at = |s: u32| v[s as usize * g.step + least - base..].as_ptr();
    if C == 1 && g.step == 1 {
        for (i, (&s, w)) in windows.take(dw).enumerate() {
            let x = at(s);
            let mut acc = [0.0f32; 4];
            let quads = taps / 4 * 4;
            for t in (0..quads).step_by(4) {
                for l in 0..4 {
                    // SAFETY: tap t + l < taps of a window inside the span (asserted above).
                    acc[l] += w[t + l] * unsafe { *x.add(t + l) };
                }
            }
            let mut sum = (acc[0] + acc[2]) + (acc[1] + acc[3]);
            for (t, wt) in w.iter().enumerate().skip(quads) {
                // SAFETY: as above.
                sum += wt * unsafe { *x.add(t) };
            }
            out[i] = sum;
        }
        return;
    }
    for (i, (&s, w)) in windows.take(dw).enumerate() {
        let x = at(s);
        let mut acc = [0.0f32; 4];
        for (t, &wt) in w.iter().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                // SAFETY: tap t's four lanes end at (t·step + 4) ≤ (taps − 1)·step + 4 from
                // the window's first channel, inside `v` for a window inside the span.
                *a += wt * unsafe { *x.add(t * g.step + l) };
            }
        }
        for c in 0..C {
            out[c * n + i] = acc[lanes[c]];
        }
    }
}

fn fill_pad(row: &mut [u8]) {
    for px in row.chunks_exact_mut(3) {
        px.copy_from_slice(&PAD_COLOUR);
    }
}

/// Grows `v` to exactly `len` (no amortised slack: the memory plan counts exact sizes).
fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.reserve_exact(len - v.len());
        v.resize(len, 0.0);
    }
}
