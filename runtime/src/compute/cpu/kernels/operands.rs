//! What the kernels of every set take: matrix views and the store's epilogue for the GEMMs,
//! the taps of a depthwise plane for the 3×3 kernels.

/// A matrix view: its data and its (row, column) strides, in elements.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

/// Row-major view: element `(i, j)` at `data[i·ld + j]`.
pub(crate) fn rm(data: &[f32], ld: usize) -> Mat<'_> {
    Mat {
        data,
        rs: ld,
        cs: 1,
    }
}

/// Transposed view of a row-major matrix with leading dimension `ld`: element `(i, j)` at
/// `data[j·ld + i]`.
pub(crate) fn tr(data: &[f32], ld: usize) -> Mat<'_> {
    Mat {
        data,
        rs: 1,
        cs: ld,
    }
}

/// What is applied to each element of C as it is stored: `relu?(… + bias[i]) + residual[i, j]`
/// for element `(i, j)`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    /// One value per row of C, added after the product.
    pub bias: Option<&'a [f32]>,
    /// `max(0, ·)`, after the bias.
    pub relu: bool,
    /// A matrix shaped as C (element `(i, j)` at `residual[i·ldc + j]`, C's leading
    /// dimension), added last: a residual add fused into the conv that feeds it.
    pub residual: Option<&'a [f32]>,
}

impl Epilogue<'_> {
    /// `relu?(v + bias[i]) + residual[at]`, the scalar form of what the register tiles do for
    /// the element at `at` (`i·ldc + j`) of row `i`.
    #[inline(always)]
    pub(crate) fn apply(&self, i: usize, at: usize, v: f32) -> f32 {
        let v = match self.bias {
            Some(b) => v + b[i],
            None => v,
        };
        let v = if self.relu { v.max(0.0) } else { v };
        match self.residual {
            Some(r) => v + r[at],
            None => v,
        }
    }
}

/// Where the nine taps of a 3×3 depthwise plane read: tap `t = 3·ky + kx` of output row `oy`
/// reads the contiguous run `src[at[t] + oy·step ..][.. ow]` (the phases of
/// [`crate::compute::cpu::depthwise`]).
#[derive(Clone, Copy)]
pub(crate) struct Taps<'a> {
    pub src: &'a [f32],
    pub at: [usize; 9],
    pub step: usize,
}

impl<'a> Taps<'a> {
    /// The runs of row `oy`, each `ow` long (panics when a run leaves `src`).
    #[inline(always)]
    pub(crate) fn row(&self, oy: usize, ow: usize) -> [&'a [f32]; 9] {
        self.at.map(|a| &self.src[a + oy * self.step..][..ow])
    }

    /// Where the runs of row `oy` start, unchecked: for the SIMD loops, after [`Taps::check`].
    #[inline(always)]
    #[allow(dead_code)] // Only the SIMD sets read raw.
    pub(crate) fn ptrs(&self, oy: usize) -> [*const f32; 9] {
        let base = self.src.as_ptr();
        self.at.map(|a| base.wrapping_add(a + oy * self.step))
    }

    /// Panics unless every run of rows `0..oh` lies inside `src` (the SIMD loops read raw).
    pub(crate) fn check(&self, oh: usize, ow: usize) {
        for a in self.at {
            assert!(
                oh == 0 || a + (oh - 1) * self.step + ow <= self.src.len(),
                "depthwise taps outside their plane"
            );
        }
    }
}

/// The masked output gradient of a plane and what it gives the weights and the bias, in one
/// pass: `g = gy ⊙ [y > 0]` (just `gy` without `y`) is written to row `oy` of `dst`
/// (`dst[at + oy·ld ..][.. ow]`), and the result is `([Σ g·tap_t], Σ g)`.
pub(crate) struct WeightGrad<'a> {
    pub gy: &'a [f32],
    pub y: Option<&'a [f32]>,
    pub dst: &'a mut [f32],
    pub at: usize,
    pub ld: usize,
}
