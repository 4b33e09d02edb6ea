//! The pass itself: the letterbox's placement, the planes and channels of each format, and
//! the row loop (see the module above for the order of work).

use fulcrum_board::protocol::PixelFormat;

use super::colour::{to_rgb, Channels, YuvToRgb};
use super::source::{Pixels, PixelsError, Rect};
use super::window::{Axis, Interval};
use super::PAD_COLOUR;
use crate::compute::cpu::kernels::{self, Kernels};
use crate::compute::cpu::pool::Pool;
use std::sync::Mutex;
use std::time::Instant;

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

impl Grid {
    /// The lowest and highest byte offset of its channels within a sample.
    fn offset_range(&self) -> (usize, usize) {
        let o = &self.offsets[..self.channels];
        (*o.iter().min().unwrap(), *o.iter().max().unwrap())
    }
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

/// One thread's scratch: a row of vertical sums and one output row's three channels.
#[derive(Debug, Default)]
struct Band {
    vrow: Vec<f32>,
    channels: Vec<f32>,
}

/// Most bands a frame is split into (one per thread of the engine's pool).
const MAX_BANDS: usize = crate::compute::cpu::pool::MAX_THREADS;

/// How many bands a frame's rows go in, chosen by measurement per frame geometry: a camera
/// sends the same size frame after frame, so the first few frames of a size try one band and
/// all of the pool's alternately, and the faster is kept (waking the pool's threads costs
/// tens of microseconds, as much as a small frame's whole pass).
#[derive(Debug, Default, Clone, Copy)]
struct BandChoice {
    /// Format, sides, crop and threads the choice is for.
    key: Option<(u8, u32, u32, Rect, usize)>,
    /// The fastest run seen with one band and with all, microseconds, and runs timed.
    one: u64,
    all: u64,
    tried: u32,
}

/// Runs of each kind a [`BandChoice`] times before it decides.
pub(super) const TRIALS: u32 = 3;

impl BandChoice {
    /// Bands for the next run of `key` on `threads`.
    fn bands(&mut self, key: (u8, u32, u32, Rect, usize)) -> usize {
        if self.key != Some(key) {
            *self = BandChoice {
                key: Some(key),
                one: u64::MAX,
                all: u64::MAX,
                tried: 0,
            };
        }
        let threads = key.4;
        match self.settled() {
            _ if threads <= 1 => 1,
            Some(bands) => bands,
            None if self.tried.is_multiple_of(2) => 1,
            None => threads,
        }
    }

    /// The bands decided on, once every trial has run.
    fn settled(&self) -> Option<usize> {
        let threads = self.key?.4;
        (self.tried >= 2 * TRIALS).then_some(if self.all < self.one { threads } else { 1 })
    }

    fn record(&mut self, bands: usize, micros: u64) {
        if self.tried < 2 * TRIALS {
            let best = if bands == 1 {
                &mut self.one
            } else {
                &mut self.all
            };
            *best = (*best).min(micros);
            self.tried += 1;
            if let (Some(bands), Some((format, w, h, crop, threads))) = (self.settled(), self.key) {
                log::debug!(
                    "frame pass: {w}x{h} {} (crop {}x{}) in {bands} band(s): fastest with one \
                     {} µs, with {threads} {} µs",
                    PixelFormat::from_u8(format).map_or("?", |f| f.name()),
                    crop.width,
                    crop.height,
                    self.one,
                    self.all
                );
            }
        }
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
    /// Scratch of each band (thread), behind a lock each takes once a frame.
    bands: Vec<Mutex<Band>>,
    /// The largest source side the scratch holds.
    max_side: u32,
    choice: BandChoice,
}

/// What every band of one frame reads: the picture, its planes and the windows.
struct Frame<'p, 'a> {
    src: &'p Pixels<'a>,
    planes: [Option<Plane>; 2],
    /// Each plane's bytes `lo .. hi` within a row that any window of its grids reads.
    spans: [(usize, usize); 2],
    channels: Channels,
    x: &'p [Axis; 2],
    y: &'p [Axis; 2],
    kernels: &'static Kernels,
    /// Output side, content width, left padding.
    n: usize,
    dw: usize,
    px: usize,
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
            bands: Vec::new(),
            max_side: 0,
            choice: BandChoice::default(),
        }
    }

    /// A pass with scratch for sources up to `max_side` pixels a side, on one thread.
    pub fn with_capacity(size: u32, max_side: u32) -> Self {
        let mut p = Self::new(size);
        p.reserve(max_side, 1);
        p
    }

    /// The output side, pixels.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Bands the last frame's geometry settled on (1: this thread alone), once measured.
    pub fn bands_chosen(&self) -> Option<usize> {
        self.choice.settled()
    }

    /// The kernel set the vertical pass runs on.
    pub fn kernel_set(&self) -> kernels::KernelSet {
        self.kernels.set
    }

    /// Most taps of a window for sources up to `max_side`: the letterbox keeps the aspect
    /// ratio, and rounding a side to at least one pixel can at most double an axis's shrink
    /// factor, so `2·max_side / size` bounds every axis's.
    pub(super) fn max_taps(max_side: u32, size: u32) -> usize {
        Axis::taps_for(f64::from(2 * max_side.max(1)), size.max(1))
    }

    /// Grows the scratch for sources up to `max_side` pixels a side, split over up to
    /// `threads` bands.
    pub fn reserve(&mut self, max_side: u32, threads: usize) {
        let (dst, taps) = (
            self.size.max(1) as usize,
            Self::max_taps(max_side, self.size),
        );
        for a in self.x.iter_mut().chain(self.y.iter_mut()) {
            a.reserve(dst, taps);
        }
        let threads = threads.clamp(1, MAX_BANDS);
        if self.bands.len() < threads {
            self.bands.reserve_exact(threads - self.bands.len());
            self.bands.resize_with(threads, Default::default);
        }
        self.max_side = self.max_side.max(max_side);
        for band in &mut self.bands {
            let band = band.get_mut().unwrap_or_else(|e| e.into_inner());
            grow(&mut band.vrow, self.max_side.max(1) as usize * 4 + SLACK);
            grow(&mut band.channels, dst * 3);
        }
    }

    /// Bytes [`FramePass::reserve`]`(max_side, threads)` holds on a new pass, computed
    /// without allocating (for memory plans).
    pub fn planned_bytes(size: u32, max_side: u32, threads: usize) -> usize {
        let (dst, taps) = (size.max(1) as usize, Self::max_taps(max_side, size));
        let band = (max_side.max(1) as usize * 4 + SLACK) * 4 + dst * 3 * 4;
        4 * Axis::planned_bytes(dst, taps)
            + threads.clamp(1, MAX_BANDS) * (band + std::mem::size_of::<Mutex<Band>>())
    }

    /// Bytes of scratch held.
    pub fn bytes(&self) -> usize {
        let bands: usize = self
            .bands
            .iter()
            .map(|b| {
                let b = b.lock().unwrap_or_else(|e| e.into_inner());
                (b.vrow.capacity() + b.channels.capacity()) * 4
            })
            .sum();
        self.x.iter().chain(&self.y).map(Axis::bytes).sum::<usize>()
            + bands
            + self.bands.capacity() * std::mem::size_of::<Mutex<Band>>()
    }

    /// Letterboxes `crop` of `src` (all of it for `None`) into `out` (`size × size × 3`
    /// bytes, RGB interleaved), on this thread. Allocates only for sources beyond what was
    /// reserved.
    pub fn run(
        &mut self,
        src: &Pixels<'_>,
        crop: Option<Rect>,
        out: &mut [u8],
    ) -> Result<Letterbox, PixelsError> {
        self.run_on(None, src, crop, out)
    }

    /// [`FramePass::run`], with the content's rows split in bands over `pool`'s threads
    /// where that measured faster for frames like this one: the first frames of a geometry try
    /// one band and all alternately, and the faster is kept.
    pub fn run_on(
        &mut self,
        pool: Option<&Pool>,
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
        let started = Instant::now();
        let placed = Letterbox::place(self.size, region.width, region.height);
        let (dw, dh) = (placed.width as usize, placed.height as usize);
        let (px, py) = (placed.pad_x as usize, placed.pad_y as usize);
        let threads = pool.map_or(1, Pool::threads);
        self.reserve(src.width().max(src.height()), threads);

        plan_windows(&mut self.x, &mut self.y, src, region, &placed);

        let row_bytes = n * 3;
        let (above, rest) = out.split_at_mut(py * row_bytes);
        let (content, below) = rest.split_at_mut(dh * row_bytes);
        fill_pad(above);
        fill_pad(below);
        let (planes, channels) = layout(src);
        let spans = planes.map(|p| p.map_or((0, 0), |p| byte_span(&p, &self.x)));
        let frame = Frame {
            src,
            planes,
            spans,
            channels,
            x: &self.x,
            y: &self.y,
            kernels: self.kernels,
            n,
            dw,
            px,
        };
        let key = (
            src.format() as u8,
            src.width(),
            src.height(),
            region,
            threads,
        );
        let bands = match pool {
            Some(_) => self.choice.bands(key).min(dh.max(1)),
            None => 1,
        };
        if bands <= 1 {
            let mut band = self.bands[0].lock().unwrap_or_else(|e| e.into_inner());
            frame.rows(&mut band, 0, content);
        } else {
            // Each band's rows, handed to whichever thread takes the band (a lock each, never
            // contended: one band per part).
            let per_band = dh.div_ceil(bands);
            let mut parts: [Mutex<&mut [u8]>; MAX_BANDS] = Default::default();
            for (part, rows) in parts
                .iter_mut()
                .zip(content.chunks_mut(per_band * row_bytes))
            {
                *part.get_mut().unwrap_or_else(|e| e.into_inner()) = rows;
            }
            let scratch = &self.bands;
            let work = |k: usize| {
                let mut band = scratch[k].lock().unwrap_or_else(|e| e.into_inner());
                let mut rows = parts[k].lock().unwrap_or_else(|e| e.into_inner());
                frame.rows(&mut band, k * per_band, &mut rows);
            };
            pool.expect("bands > 1 only with a pool")
                .run(dh.div_ceil(per_band), &work);
        }
        self.choice
            .record(bands, started.elapsed().as_micros() as u64);
        Ok(placed)
    }
}

/// Plans the windows of `region` of `src` onto the letterbox's content `placed`: across
/// (pixels, then chroma samples where chroma is halved across) into `x`, down (pixel rows,
/// then 4:2:0 chroma rows) into `y`. The axes a format has no use for are left as they were.
pub(super) fn plan_windows(
    x: &mut [Axis; 2],
    y: &mut [Axis; 2],
    src: &Pixels<'_>,
    region: Rect,
    placed: &Letterbox,
) {
    let across = Interval::whole(region.x, region.width);
    let down = Interval::whole(region.y, region.height);
    x[0].plan(across, placed.width);
    y[0].plan(down, placed.height);
    let (halved_x, halved_y) = src.format().chroma_halves();
    if halved_x {
        x[1].plan(across.halved(), placed.width);
    }
    if halved_y {
        y[1].plan(down.halved(), placed.height);
    }
}

impl Frame<'_, '_> {
    /// Content rows `first ..` (as many as `out` holds) into `out`, whole output rows.
    fn rows(&self, band: &mut Band, first: usize, out: &mut [u8]) {
        let n = self.n;
        for (k, row) in out.chunks_exact_mut(n * 3).enumerate() {
            fill_pad(&mut row[..self.px * 3]);
            fill_pad(&mut row[(self.px + self.dw) * 3..]);
            for (plane, &span) in self.planes.iter().zip(&self.spans) {
                if let Some(plane) = plane {
                    self.plane_row(band, plane, span, first + k);
                }
            }
            let (a, rest) = band.channels[..3 * n].split_at(n);
            let (b, c) = rest.split_at(n);
            to_rgb(
                self.channels,
                [a, b, c],
                &mut row[self.px * 3..(self.px + self.dw) * 3],
            );
        }
    }

    /// Output row `j` of one plane's channels: the vertical sums of its bytes, then each
    /// grid's horizontal windows into the band's channels.
    fn plane_row(&self, band: &mut Band, plane: &Plane, (lo, hi): (usize, usize), j: usize) {
        let n = self.n;
        let axis = &self.y[usize::from(plane.halved_y)];
        let (first_row, weights) = axis.window(j);
        let stride = self.src.stride();
        let start = plane.offset + first_row as usize * stride + lo;
        let len = hi - lo;
        let bytes = self.src.bytes();
        // The picture was checked to hold every row of every plane in full, and windows lie
        // inside the picture: this holds for every well-formed `Pixels`.
        assert!(
            start + (weights.len() - 1) * stride + len <= bytes.len(),
            "frame pass reads outside the picture"
        );
        let vrow = &mut band.vrow[..len + SLACK];
        // SAFETY: the kernels come from `kernels::table` (only sets this CPU runs); the
        // assertion above is the kernel's bound on `src`, and `weights` is not empty.
        unsafe { (self.kernels.weighted_rows)(&bytes[start..], stride, weights, &mut vrow[..len]) };
        for g in plane.grids.iter().flatten() {
            let axis = &self.x[usize::from(g.halved_x)];
            let out = &mut band.channels[g.first * n..(g.first + g.channels) * n];
            if let Some(gather) = self.kernels.gather_taps {
                gather_channels(gather, vrow, lo, g, axis, out, self.dw);
                continue;
            }
            match g.channels {
                1 => horizontal::<1>(vrow, lo, g, axis, out, self.dw),
                2 => horizontal::<2>(vrow, lo, g, axis, out, self.dw),
                _ => horizontal::<3>(vrow, lo, g, axis, out, self.dw),
            }
        }
    }
}

/// The bytes `lo .. hi` of a row of `plane` that any window of any of its grids reads, the
/// windows across being `x` (pixels, then chroma samples).
fn byte_span(plane: &Plane, x: &[Axis; 2]) -> (usize, usize) {
    let (mut lo, mut hi) = (usize::MAX, 0);
    for g in plane.grids.iter().flatten() {
        let (s0, s1) = x[usize::from(g.halved_x)].span();
        let (least, most) = g.offset_range();
        lo = lo.min(s0 as usize * g.step + least);
        hi = hi.max((s1 as usize - 1) * g.step + most + 1);
    }
    (lo, hi)
}

/// Asserts that every window of `axis` over grid `g` reads inside a row of sums `v` that
/// starts at byte `base`, `reach` floats past a window's last sample's first channel included:
/// windows start at or after the axis's first sample and end by its last, so checking the
/// span's ends covers them all, once per row rather than once per tap.
fn assert_inside(v: &[f32], base: usize, g: &Grid, axis: &Axis, reach: usize) {
    let (lo, hi) = axis.span();
    let (least, _) = g.offset_range();
    assert!(
        lo as usize * g.step + least >= base
            && (hi as usize - 1) * g.step + least + reach <= base + v.len(),
        "horizontal windows reach outside the row of sums"
    );
}

/// The horizontal windows of each channel of a grid by the kernel set's gathers: the same
/// sums as [`horizontal`] (in the same order of taps), several outputs at a time.
fn gather_channels(
    gather: kernels::GatherTaps,
    v: &[f32],
    base: usize,
    g: &Grid,
    axis: &Axis,
    out: &mut [f32],
    dw: usize,
) {
    let n = out.len() / g.channels;
    let taps = axis.taps();
    let (least, most) = g.offset_range();
    assert_inside(v, base, g, axis, most - least + 1);
    assert!(v.len() < i32::MAX as usize && dw <= axis.outputs());
    for (c, out) in out.chunks_exact_mut(n).enumerate() {
        let offset = g.offsets[c] as isize - base as isize;
        // SAFETY: a table's kernel (only sets this CPU runs); dw ≤ the axis's outputs, whose
        // starts and tap-major weights it holds, and every index read is inside `v`
        // (asserted above for the span that holds every window).
        unsafe {
            gather(
                v,
                axis.starts(),
                axis.weights_by_tap(),
                axis.outputs(),
                taps,
                g.step,
                offset,
                &mut out[..dw],
            )
        };
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
    let (least, _) = g.offset_range();
    let lanes: [usize; C] = std::array::from_fn(|c| g.offsets[c] - least);
    debug_assert!(lanes.iter().all(|&l| l < 4));
    let windows = axis.starts().iter().zip(axis.weights().chunks_exact(taps));
    // Four lanes from each tap's first channel: the reads below stay inside `v`.
    assert_inside(v, base, g, axis, 4);
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
