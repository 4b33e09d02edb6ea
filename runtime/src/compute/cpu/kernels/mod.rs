//! The CPU engine's hot loops, one set per instruction set, chosen once per process.
//!
//! Each set fills a `Kernels` table of function pointers (the GEMM panels and the 3×3
//! depthwise plane kernels), the way tract's `linalg` does; the callers (`cpu::gemm`,
//! `cpu::dw3x3`) check their operands once and call through `active()`. This module is the
//! only place that asks the CPU what it has:
//!
//! | set | where | what |
//! |-----|-------|------|
//! | `portable` | everywhere | plain loops at the compiler's baseline (SSE2 on x86-64, NEON on aarch64) |
//! | `avx2` | x86-64 with AVX2 and FMA | register tiles with explicit FMA |
//! | `avx512` | x86-64 with AVX-512F | 16-lane GEMM tiles under lane masks; the AVX2 depthwise |
//! | `neon` | aarch64 (NEON is baseline there) | register tiles with explicit FMA |
//!
//! `FULCRUM_CPU_KERNELS=portable|avx2|avx512|neon` forces a set for A/B runs; without it the best
//! set the CPU has runs.

mod operands;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod panel;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod plane;
mod portable;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

use std::sync::OnceLock;

pub(crate) use operands::{rm, tr, Epilogue, Mat, Taps, WeightGrad};
pub(crate) use portable::{dot_lanes, hsum};

/// The environment variable that forces a kernel set.
pub const ENV: &str = "FULCRUM_CPU_KERNELS";

/// One set of kernels, named for the instructions it is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelSet {
    Portable,
    Avx2,
    Avx512,
    Neon,
}

impl KernelSet {
    /// Every set fulcrum has, best last.
    pub const ALL: [KernelSet; 4] = [
        KernelSet::Portable,
        KernelSet::Avx2,
        KernelSet::Avx512,
        KernelSet::Neon,
    ];

    /// The name `FULCRUM_CPU_KERNELS` takes and the reports print.
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Portable => "portable",
            KernelSet::Avx2 => "avx2",
            KernelSet::Avx512 => "avx512",
            KernelSet::Neon => "neon",
        }
    }

    /// What the set is written with, for people.
    pub fn describe(self) -> &'static str {
        match self {
            KernelSet::Portable => "plain loops at the compiler's baseline",
            KernelSet::Avx2 => "AVX2 + FMA register tiles",
            KernelSet::Avx512 => "AVX-512 register tiles (AVX2 depthwise)",
            KernelSet::Neon => "NEON register tiles",
        }
    }

    /// The set named `name` (as [`KernelSet::name`] prints it, any case).
    pub fn parse(name: &str) -> Option<KernelSet> {
        Self::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this CPU (and this build's architecture) can run the set.
    pub fn runs_here(self) -> bool {
        table(self).is_some()
    }

    /// The sets this CPU can run, portable first.
    pub fn here() -> Vec<KernelSet> {
        Self::ALL.into_iter().filter(|s| s.runs_here()).collect()
    }

    /// The best set this CPU can run.
    pub fn best() -> KernelSet {
        Self::ALL
            .into_iter()
            .rev()
            .find(|s| s.runs_here())
            .unwrap_or(KernelSet::Portable)
    }
}

impl std::fmt::Display for KernelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `C ← ep(alpha·A·B + beta·C)` in one pass; with `beta = 0`, C is not read.
///
/// C is a pointer, not a slice, so that threads can each own some columns of the same rows
/// (a batch-1 pointwise conv split by columns: see [`crate::compute::cpu::gemm`]).
///
/// # Safety
/// The table it came from is the one of a set that runs here (only [`table`] hands tables
/// out); the caller checked that the last elements of A (`m × k`) and B (`k × n`) lie inside
/// their slices, that `ep.bias`, when given, holds `m` values and `ep.residual`, when given,
/// element `(m − 1)·ldc + n − 1`; and C's elements
/// `c[i·ldc + j]` (`i < m`, `j < n`, `ldc ≥ n`) are valid for reads and writes and not
/// accessed by anyone else while this runs.
pub(crate) type GemmFused = unsafe fn(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    ep: Epilogue<'_>,
);

/// `C += alpha·A·B`.
///
/// # Safety
/// As for [`GemmFused`] (`k > 0`).
pub(crate) type GemmAccumulate = unsafe fn(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
);

/// `out[oy][·] = relu?(bias + Σ_t w[t]·tap_t[oy][·])` for an `oh × ow` output plane.
///
/// # Safety
/// A table of a set that runs here; `out.len()` is a multiple of `ow > 0` and `taps` passed
/// [`Taps::check`] for its `out.len() / ow` rows.
pub(crate) type Dw3x3Conv =
    unsafe fn(taps: Taps<'_>, w: &[f32; 9], bias: f32, relu: bool, out: &mut [f32], ow: usize);

/// `out = relu?(bias + conv3x3(x))` for rows `oy0 ..` of an `oh × ow` output plane of a pad-1
/// conv read straight from its input plane `x`: the zero border is implied and, with stride 2,
/// the even and odd columns are split in registers, where the phases would copy them. The
/// same sums in the same order as [`Dw3x3Conv`] over phases. With stride 1 the input is
/// `oh × ow` (the output the size of the input), with stride 2 it is `2·oh × 2·ow`. `out`
/// holds the band's rows only (`out.len() / ow` of them), so threads can each take a band.
///
/// # Safety
/// A table of a set that runs here; `out.len()` is a multiple of `ow > 0`, `oy0 +
/// out.len() / ow ≤ oh`, and `x.len()` is `oh·ow` (stride 1) or `4·oh·ow` (stride 2), as the
/// field holding it says.
pub(crate) type Dw3x3InPlace = unsafe fn(
    x: &[f32],
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
    oy0: usize,
    oh: usize,
);

/// See [`WeightGrad`]: the masked gradient written and its sums against the taps.
///
/// # Safety
/// A table of a set that runs here; `gy.len()` is a multiple of `ow > 0`, `taps` passed
/// [`Taps::check`] for its rows, `y` (when given) is as long as `gy` and every row of `dst`
/// lies inside it.
pub(crate) type Dw3x3WeightGrad =
    unsafe fn(taps: Taps<'_>, wg: WeightGrad<'_>, ow: usize) -> ([f32; 9], f32);

/// Input gradient of a 3×3, stride-2, pad-1 depthwise conv whose input is exactly twice its
/// output (`2·oh × 2·ow`), as a gather: `g` is the masked output gradient, `oh + 1` rows of
/// `ow + 1` with a zero last row and column. Input pixel `(2a + u, 2b + v)` gets
/// taps `ky ∈ {1}` (u = 0) or `{0 → a + 1, 2 → a}` (u = 1), and likewise for columns.
///
/// # Safety
/// A table of a set that runs here; `gx.len() = 4·oh·ow` and `g.len() ≥ (oh + 1)·(ow + 1)`.
pub(crate) type Dw3x3InputGradS2 = unsafe fn(g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize);

/// `out = ep(W · im2col(x))`, output rows `rows` of one image of a dense (one group) 3×3,
/// stride-2, pad-1 convolution whose input is even-sized: `x` is `c_in` planes of
/// `2·oh × 2·ow`, `weight` `m × c_in·9` (row-major, taps in `(ci, ky, kx)` order), `out` `m`
/// planes of `oh × ow`. Each input row is split once into its even and its odd columns, and
/// the fused GEMM's tiles read every tap's run of B there in place, so neither `im2col` nor
/// the GEMM's packing copies them; the sums are those of `im2col` + [`GemmFused`], in the
/// same order. `out` is a pointer so that threads can each take a band of rows of every plane.
///
/// # Safety
/// A table of a set that runs here; `c_in·9 ≤` [`DENSE3X3_MAX_TAPS`], `ow > 0`,
/// `rows.end ≤ oh`, `x` holds the whole input (see [`Dense3x3Input`]), `weight.len() ≥
/// m·c_in·9`, `ep.bias`, when
/// given, holds `m` values and `ep.residual` is `None`; and the elements
/// `out[(i·oh + oy)·ow + ox]` (`i < m`, `oy` in `rows`, `ox < ow`) are valid for writes and
/// accessed by nothing else while this runs.
pub(crate) type Dense3x3Half = unsafe fn(
    x: Dense3x3Input<'_>,
    c_in: usize,
    weight: &[f32],
    m: usize,
    ep: Epilogue<'_>,
    out: *mut f32,
    oh_ow: (usize, usize),
    rows: std::ops::Range<usize>,
);

/// The input of a [`Dense3x3Half`] conv, `2·oh × 2·ow` pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dense3x3Input<'a> {
    /// `c_in` planes of floats, `x.len() ≥ 4·c_in·oh·ow`.
    Planes(&'a [f32]),
    /// One 8-bit RGB image, pixels interleaved (`image.len() ≥ 3·4·oh·ow`; `c_in` = 3, `2·ow ≤`
    /// [`RGB_MAX_W`]), normalised as it is read exactly as [`RgbRow`] does, mirrored with
    /// `flip`: the network's input straight from a record (see [`super::stem`]).
    Rgb { image: &'a [u8], flip: bool },
}

/// Widest RGB image a [`Dense3x3Half`] reads ([`Dense3x3Input::Rgb`]): its input rows, as
/// floats and split into even and odd columns, stay on the stack (38 KiB at this width).
pub(crate) const RGB_MAX_W: usize = 768;

/// Most taps (`c_in·9`) a [`Dense3x3Half`] sums: a GEMM panel's rows.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) const DENSE3X3_MAX_TAPS: usize = panel::KC;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) const DENSE3X3_MAX_TAPS: usize = 0;

/// One row of an 8-bit RGB image (`src`, `3·w` bytes, pixels interleaved) as three rows of
/// floats in `[0, 1]` (`byte / 255`, exactly), one per channel plane; with `flip`, mirrored
/// (pixel `x` lands in column `w − 1 − x`).
///
/// # Safety
/// A table of a set that runs here; `src.len() = 3·w` where `w` is the length of every row
/// of `dst`.
pub(crate) type RgbRow = unsafe fn(src: &[u8], flip: bool, dst: [&mut [f32]; 3]);

/// `out[x] = Σ_t weights[t] · src[t·stride + x]` for every `x < out.len()`: weighted sums of
/// `weights.len()` rows of bytes, `stride` bytes apart (the frame pass's vertical windows;
/// zero weights, a window's padding, may be skipped).
///
/// # Safety
/// A table of a set that runs here; `weights` is not empty and
/// `(weights.len() − 1)·stride + out.len() ≤ src.len()`.
pub(crate) type WeightedRows =
    unsafe fn(src: &[u8], stride: usize, weights: &[f32], out: &mut [f32]);

/// `out[i] = Σ_t weights[t·dst + i] · v[starts[i]·step + offset + t·step]` for every
/// `i < out.len()`: one channel of the frame pass's horizontal windows, vectorised across
/// outputs (each lane gathers its window's samples). `weights` is laid out tap by tap, `dst`
/// outputs a tap.
///
/// # Safety
/// A table of a set that runs here; `out.len() ≤ dst ≤ starts.len()`, `weights.len() ≥
/// taps·dst`, `taps ≥ 1`, and for every `i < out.len()` the index `starts[i]·step + offset`
/// is ≥ 0 and `starts[i]·step + offset + (taps − 1)·step < v.len() ≤ i32::MAX`.
pub(crate) type GatherTaps = unsafe fn(
    v: &[f32],
    starts: &[u32],
    weights: &[f32],
    dst: usize,
    taps: usize,
    step: usize,
    offset: isize,
    out: &mut [f32],
);

/// One set's kernels. Only [`table`] hands them out, and only for a set the CPU can run:
/// that is what makes calling through them sound.
pub(crate) struct Kernels {
    pub set: KernelSet,
    /// The fused GEMM, where the set has one (the caller falls back to scaling C, then
    /// [`Kernels::gemm_accumulate`], then the epilogue).
    pub gemm_fused: Option<GemmFused>,
    pub gemm_accumulate: GemmAccumulate,
    pub dw3x3_conv: Dw3x3Conv,
    /// The stride-1, pad-1 depthwise plane without phases, where the set has one (the caller
    /// falls back to phases and [`Kernels::dw3x3_conv`]).
    pub dw3x3_same: Option<Dw3x3InPlace>,
    /// The stride-2, pad-1 depthwise plane of an even-sized input without phases, likewise.
    pub dw3x3_half: Option<Dw3x3InPlace>,
    /// The stride-2 dense 3×3 conv (the stem) without `im2col`, where the set has one (the
    /// caller falls back to `im2col` and the GEMM).
    pub dense3x3_half: Option<Dense3x3Half>,
    pub dw3x3_weight_grad: Dw3x3WeightGrad,
    /// The network input from a record's pixels (`Normalize`).
    pub rgb_row: RgbRow,
    pub dw3x3_input_grad_s2: Dw3x3InputGradS2,
    /// The frame pass's vertical windows ([`crate::pixels`]).
    pub weighted_rows: WeightedRows,
    /// Its horizontal windows by gathers, where the set has them (the pass falls back to
    /// its own loops, a window at a time).
    pub gather_taps: Option<GatherTaps>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernels({})", self.set)
    }
}

/// The kernels of `set`, when this CPU can run them.
pub(crate) fn table(set: KernelSet) -> Option<&'static Kernels> {
    match set {
        KernelSet::Portable => Some(&portable::KERNELS),
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx2 => avx2::kernels(),
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512 => avx512::kernels(),
        #[cfg(target_arch = "aarch64")]
        KernelSet::Neon => Some(&neon::KERNELS),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// A `FULCRUM_CPU_KERNELS` this process cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    #[error("{ENV}={value:?} names no kernel set; use one of: {}", names(&KernelSet::ALL))]
    Unknown { value: String },
    #[error(
        "{ENV}={set} cannot run on this CPU ({arch}); it can run: {}. Unset {ENV} to use the best",
        names(&KernelSet::here()),
        arch = std::env::consts::ARCH
    )]
    NotHere { set: KernelSet },
}

/// `sets` by name, comma-separated, for messages and reports.
pub fn names(sets: &[KernelSet]) -> String {
    sets.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
}

/// The set `FULCRUM_CPU_KERNELS` asks for (an empty value is no value), or the best one.
pub fn chosen() -> Result<KernelSet, ChoiceError> {
    let value = std::env::var(ENV).unwrap_or_default();
    if value.trim().is_empty() {
        return Ok(KernelSet::best());
    }
    let set = KernelSet::parse(&value).ok_or(ChoiceError::Unknown { value })?;
    if !set.runs_here() {
        return Err(ChoiceError::NotHere { set });
    }
    Ok(set)
}

/// The kernels every CPU kernel of this process calls: the [`chosen`] set, decided on first
/// use. An engine asks [`chosen`] first so that a bad `FULCRUM_CPU_KERNELS` is an error; any
/// other caller gets the best set then.
pub(crate) fn active() -> &'static Kernels {
    static ACTIVE: OnceLock<&'static Kernels> = OnceLock::new();
    ACTIVE.get_or_init(|| {
        let set = chosen().unwrap_or_else(|_| KernelSet::best());
        table(set).unwrap_or(&portable::KERNELS)
    })
}

#[cfg(test)]
mod tests;
