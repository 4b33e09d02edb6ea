//! Operation descriptions shared by both engines.
//!
//! Every kernel of the detector is described here once, as a plain `Copy` struct of integers,
//! floats and flags: its shape and its parameters, nothing else (the `tract` style: ops are
//! data). The CPU engine ([`crate::compute::cpu`]) takes them as the first argument of its
//! kernels; the Vulkan engine turns the same fields into push and specialisation constants. The
//! sizes a recording must allocate (`input_len`, `output_len`, …) come from the same methods, so
//! the two engines cannot disagree about a buffer.
//!
//! Conventions, for every op:
//!
//! - Tensors are `f32`, NCHW, contiguous: element `(b, c, y, x)` of a `n × c × h × w` tensor is
//!   at `((b·c_total + c)·h + y)·w + x`.
//! - Shapes are `u32` (what a shader indexes with); `validate` refuses a description whose
//!   buffers would not be indexable by `u32`, or that makes no sense (zero sizes, channels that
//!   do not divide into groups, …), with a message naming the field.
//! - Lengths returned by the `*_len` methods are in elements (`f32`) unless they say bytes.
//! - Gradients: a backward kernel *overwrites* its gradient outputs (it does not accumulate);
//!   where a tensor feeds two consumers (a residual), the model adds the two gradients with the
//!   residual-add kernel.

/// Largest number of elements any buffer may hold: indices must fit in a shader's `uint`.
pub const MAX_ELEMENTS: u64 = u32::MAX as u64;

/// Why an op's `validate` refused its description. The messages name the op and the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// A size or count that must be at least 1 is 0.
    #[error("{field} is 0; it must be at least 1")]
    Zero { field: &'static str },
    /// A buffer too large for a kernel's `u32` indices ([`MAX_ELEMENTS`]).
    #[error("{what} has {len} elements, more than the {MAX_ELEMENTS} a kernel can index")]
    TooLarge { what: &'static str, len: u64 },
    /// A field out of its range, or fields that do not agree with each other, in words.
    #[error("{0}")]
    Invalid(String),
}

fn check_nonzero(fields: &[(&'static str, u32)]) -> Result<(), OpError> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some(&(field, _)) => Err(OpError::Zero { field }),
        None => Ok(()),
    }
}

fn check_fits(what: &'static str, len: u64) -> Result<(), OpError> {
    match len > MAX_ELEMENTS {
        true => Err(OpError::TooLarge { what, len }),
        false => Ok(()),
    }
}

/// Which code path a convolution takes (both engines specialise on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvKind {
    /// `1×1`, stride 1, no padding, one group: a plain matrix product per image.
    Pointwise,
    /// One group per channel and one output channel per input channel (`groups = c_in = c_out`).
    Depthwise,
    /// One group, any kernel: `im2col` + matrix product.
    Dense,
    /// Several groups of several channels each: like `Dense`, group by group.
    Grouped,
}

/// 2-D convolution + bias, with an optional ReLU fused after it.
///
/// Input `n × c_in × h × w`, weight `c_out × (c_in/groups) × kernel × kernel`, bias `c_out`,
/// output `n × c_out × out_h × out_w` with `out_h = (h + 2·pad − kernel)/stride + 1`. Output
/// channel `o` belongs to group `g = o / (c_out/groups)` and sees input channels
/// `g·(c_in/groups) .. (g+1)·(c_in/groups)`. Padding is zeros, `pad` pixels on every side
/// (det-s uses `kernel/2`, what the constructors set).
///
/// With `relu`, the output is `max(0, conv + bias)` and the backward pass lets the gradient
/// through where the stored output is `> 0` (so the gradient at exactly 0 is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2d {
    pub n: u32,
    pub c_in: u32,
    pub h: u32,
    pub w: u32,
    pub c_out: u32,
    pub kernel: u32,
    pub stride: u32,
    pub pad: u32,
    pub groups: u32,
    pub relu: bool,
}

impl Conv2d {
    /// A dense (one group) `kernel × kernel` convolution with padding `kernel/2`.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        n: u32,
        c_in: u32,
        h: u32,
        w: u32,
        c_out: u32,
        kernel: u32,
        stride: u32,
        relu: bool,
    ) -> Self {
        Conv2d {
            n,
            c_in,
            h,
            w,
            c_out,
            kernel,
            stride,
            pad: kernel / 2,
            groups: 1,
            relu,
        }
    }

    /// A depthwise `kernel × kernel` convolution over `c` channels with padding `kernel/2`.
    pub fn depthwise(n: u32, c: u32, h: u32, w: u32, kernel: u32, stride: u32, relu: bool) -> Self {
        Conv2d {
            n,
            c_in: c,
            h,
            w,
            c_out: c,
            kernel,
            stride,
            pad: kernel / 2,
            groups: c,
            relu,
        }
    }

    /// A pointwise (`1×1`, stride 1) convolution.
    pub fn pointwise(n: u32, c_in: u32, h: u32, w: u32, c_out: u32, relu: bool) -> Self {
        Conv2d::dense(n, c_in, h, w, c_out, 1, 1, relu)
    }

    pub fn out_h(&self) -> u32 {
        (self.h + 2 * self.pad - self.kernel) / self.stride + 1
    }

    pub fn out_w(&self) -> u32 {
        (self.w + 2 * self.pad - self.kernel) / self.stride + 1
    }

    /// Input channels each output channel sees.
    pub fn c_in_per_group(&self) -> u32 {
        self.c_in / self.groups
    }

    /// Output channels of one group.
    pub fn c_out_per_group(&self) -> u32 {
        self.c_out / self.groups
    }

    pub fn input_len(&self) -> usize {
        self.n as usize * self.c_in as usize * self.h as usize * self.w as usize
    }

    pub fn output_len(&self) -> usize {
        self.n as usize * self.c_out as usize * self.out_h() as usize * self.out_w() as usize
    }

    /// `c_out × (c_in/groups) × kernel × kernel`.
    pub fn weight_len(&self) -> usize {
        self.c_out as usize
            * self.c_in_per_group() as usize
            * self.kernel as usize
            * self.kernel as usize
    }

    pub fn bias_len(&self) -> usize {
        self.c_out as usize
    }

    /// Floating-point operations of the forward pass: two per multiply-add (bias and ReLU not
    /// counted). The backward pass costs about twice this.
    pub fn flops(&self) -> u64 {
        2 * self.output_len() as u64
            * self.c_in_per_group() as u64
            * self.kernel as u64
            * self.kernel as u64
    }

    pub fn kind(&self) -> ConvKind {
        if self.kernel == 1 && self.stride == 1 && self.pad == 0 && self.groups == 1 {
            ConvKind::Pointwise
        } else if self.groups == self.c_in && self.c_out == self.c_in && self.groups > 1 {
            ConvKind::Depthwise
        } else if self.groups == 1 {
            ConvKind::Dense
        } else {
            ConvKind::Grouped
        }
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[
            ("conv n", self.n),
            ("conv c_in", self.c_in),
            ("conv h", self.h),
            ("conv w", self.w),
            ("conv c_out", self.c_out),
            ("conv kernel", self.kernel),
            ("conv stride", self.stride),
            ("conv groups", self.groups),
        ])?;
        if !self.c_in.is_multiple_of(self.groups) || !self.c_out.is_multiple_of(self.groups) {
            return Err(OpError::Invalid(format!(
                "conv groups {} must divide c_in {} and c_out {}",
                self.groups, self.c_in, self.c_out
            )));
        }
        if self.pad >= self.kernel {
            return Err(OpError::Invalid(format!(
                "conv pad {} must be below the kernel size {} (det-s pads kernel/2)",
                self.pad, self.kernel
            )));
        }
        let (hp, wp) = (
            self.h as u64 + 2 * self.pad as u64,
            self.w as u64 + 2 * self.pad as u64,
        );
        if hp < self.kernel as u64 || wp < self.kernel as u64 {
            return Err(OpError::Invalid(format!(
                "conv kernel {} larger than the padded input {hp}×{wp}",
                self.kernel
            )));
        }
        check_fits("conv input", self.input_len() as u64)?;
        check_fits("conv output", self.output_len() as u64)?;
        check_fits("conv weight", self.weight_len() as u64)
    }
}

/// Element-wise sum of two tensors of `len` elements (the residual add). Its backward pass is
/// the identity: both inputs get the output's gradient (accumulated with this same kernel where
/// a tensor has two consumers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Add {
    pub len: u32,
}

impl Add {
    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("add len", self.len)])
    }
}

/// Nearest-neighbour upsampling by 2 in both directions: `n × c × h × w` → `n × c × 2h × 2w`,
/// output `(y, x)` copies input `(y/2, x/2)`. Backward: each input gradient is the sum of its
/// four output gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Upsample2x {
    pub n: u32,
    pub c: u32,
    pub h: u32,
    pub w: u32,
}

impl Upsample2x {
    pub fn input_len(&self) -> usize {
        self.n as usize * self.c as usize * self.h as usize * self.w as usize
    }

    pub fn output_len(&self) -> usize {
        4 * self.input_len()
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[
            ("upsample n", self.n),
            ("upsample c", self.c),
            ("upsample h", self.h),
            ("upsample w", self.w),
        ])?;
        check_fits("upsample output", self.output_len() as u64)
    }
}

/// Image bytes to network input: `n` records, each starting with a `h × w × 3` u8 HWC RGB
/// image (the record layout of [`crate::format::RecordLayout`]: the image comes first), records
/// `record_stride` bytes apart; output `n × 3 × h × w` f32 with value `byte / 255`. With `flip`
/// every image is mirrored horizontally (output `x` reads input `w − 1 − x`). No backward: the
/// input is data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Normalize {
    pub n: u32,
    pub h: u32,
    pub w: u32,
    /// Bytes from one record to the next (`RecordLayout::record_size`); at least `h·w·3`.
    pub record_stride: u32,
    pub flip: bool,
}

impl Normalize {
    /// Bytes of one image, `h·w·3`.
    pub fn image_bytes(&self) -> usize {
        self.h as usize * self.w as usize * 3
    }

    /// Bytes the input must hold: `(n − 1)·record_stride + image_bytes`.
    pub fn input_bytes(&self) -> usize {
        (self.n as usize - 1) * self.record_stride as usize + self.image_bytes()
    }

    pub fn output_len(&self) -> usize {
        self.n as usize * self.image_bytes()
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[
            ("normalize n", self.n),
            ("normalize h", self.h),
            ("normalize w", self.w),
        ])?;
        if (self.record_stride as usize) < self.image_bytes() {
            return Err(OpError::Invalid(format!(
                "normalize record_stride {} is smaller than one {}×{}×3 image",
                self.record_stride, self.h, self.w
            )));
        }
        check_fits("normalize input", self.input_bytes() as u64)?;
        check_fits("normalize output", self.output_len() as u64)
    }
}

/// Most output levels a detector has (strides 8, 16 and 32).
pub const MAX_LEVELS: usize = 3;

/// A box goes to the first level whose stride times this exceeds its longer side (the last
/// level takes the rest): with strides 8/16/32, boxes under 48 px to stride 8, under 96 px to
/// stride 16, the rest to stride 32: the finer levels' boxes span under 6 of their cells.
/// 4 (YOLO's anchor ranges, 32 and 64 px) sent every raccoon over a quarter of a 256 px
/// photo to stride 32; 6 scored higher on the raccoon hold-outs and as high on the synthetic
/// set of mostly small boxes (docs/perf/recipes.md).
pub const LEVEL_SPLIT: f32 = 6.0;

/// The output grids of a detector, one per stride, concatenated cell by cell: in every channel
/// plane of the output (and of the targets), level `l`'s `grid_h(l) × grid_w(l)` cells, row by
/// row, follow level `l − 1`'s. One level is the single-grid layout `grid_h × grid_w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    /// Levels in use (1 to [`MAX_LEVELS`]).
    pub count: u32,
    /// Input pixels per cell of each level, increasing; unused entries 0.
    pub strides: [u32; MAX_LEVELS],
    /// Input image size in pixels (each level's grid is this over its stride).
    pub input_h: u32,
    pub input_w: u32,
}

impl Levels {
    /// One `grid_h × grid_w` grid of `stride`-pixel cells.
    pub fn single(grid_h: u32, grid_w: u32, stride: u32) -> Levels {
        Levels {
            count: 1,
            strides: [stride, 0, 0],
            input_h: grid_h * stride,
            input_w: grid_w * stride,
        }
    }

    /// Grids of the given strides over an `input_h × input_w` image.
    pub fn new(strides: &[u32], input_h: u32, input_w: u32) -> Levels {
        let mut s = [0; MAX_LEVELS];
        s[..strides.len().min(MAX_LEVELS)]
            .copy_from_slice(&strides[..strides.len().min(MAX_LEVELS)]);
        Levels {
            count: strides.len() as u32,
            strides: s,
            input_h,
            input_w,
        }
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn stride(&self, level: usize) -> u32 {
        self.strides[level]
    }

    /// `(rows, columns)` of level `level`'s grid.
    pub fn grid(&self, level: usize) -> (u32, u32) {
        let s = self.strides[level].max(1);
        (self.input_h / s, self.input_w / s)
    }

    pub fn cells(&self, level: usize) -> usize {
        let (h, w) = self.grid(level);
        h as usize * w as usize
    }

    /// Where level `level`'s cells start in a channel plane.
    pub fn offset(&self, level: usize) -> usize {
        (0..level).map(|l| self.cells(l)).sum()
    }

    /// Cells of one channel plane: every level's.
    pub fn total_cells(&self) -> usize {
        (0..self.len()).map(|l| self.cells(l)).sum()
    }

    /// The level a box whose longer side is `side` pixels is assigned to ([`LEVEL_SPLIT`]).
    pub fn level_of(&self, side: f32) -> usize {
        let last = self.len() - 1;
        (0..last)
            .find(|&l| side < LEVEL_SPLIT * self.strides[l] as f32)
            .unwrap_or(last)
    }

    /// The words shaders take: count, the three strides, input height and width.
    pub fn words(&self) -> [u32; 6] {
        let [a, b, c] = self.strides;
        [self.count, a, b, c, self.input_h, self.input_w]
    }

    pub fn validate(&self, what: &str) -> Result<(), OpError> {
        if !(1..=MAX_LEVELS as u32).contains(&self.count) {
            return Err(OpError::Invalid(format!(
                "{what}: {} levels; a detector has 1 to {MAX_LEVELS}",
                self.count
            )));
        }
        for l in 0..self.len() {
            let s = self.strides[l];
            if s == 0 || !self.input_h.is_multiple_of(s) || !self.input_w.is_multiple_of(s) {
                return Err(OpError::Invalid(format!(
                    "{what}: stride {s} of level {l} does not divide the {}×{} input",
                    self.input_w, self.input_h
                )));
            }
            if l > 0 && s <= self.strides[l - 1] {
                return Err(OpError::Invalid(format!(
                    "{what}: level strides must increase"
                )));
            }
        }
        if self.strides[self.len()..].iter().any(|&s| s != 0) {
            return Err(OpError::Invalid(format!(
                "{what}: strides beyond the levels in use must be 0"
            )));
        }
        Ok(())
    }
}

/// CenterNet training targets rendered from the boxes inside the records.
///
/// Input: `n` records `record_stride` bytes apart; in each, the metadata starts `meta_offset`
/// bytes in (`RecordLayout::image_bytes`): box count as `u16` at `meta_offset + 4`, box `i` at
/// `meta_offset + 40 + 20·i` as `class: u32, x0, y0, x1, y1: f32` (little endian, pixels of the
/// `input_w × input_h` image). At most `max_boxes` boxes are read.
///
/// Output: `n × (classes + 5) × cells`, `cells` every level's grid cells ([`Levels`]),
/// channels in the order of the model's output: `classes` heat maps, offset x, offset y, log
/// width, log height, then the centre mask. Each box is rendered on one level, the one
/// [`Levels::level_of`] assigns its longer side to, with `stride` that level's: for a box with
/// centre `(cx, cy)` and size `(bw, bh)` in its level's cells (pixels / `stride`), its centre
/// cell is `(⌊cx⌋, ⌊cy⌋)` (clamped into the grid); there the offsets are `cx − ⌊cx⌋`,
/// `cy − ⌊cy⌋`, the sizes `ln bw`, `ln bh` and the mask is 1. Its class channel gets a Gaussian
/// `exp(−(dx² + dy²)/(2σ²))` over the cells `|dx|, |dy| ≤ r` around the centre cell, where
/// `r = ⌊gaussian_radius(bh, bw, min_overlap)⌋` (CenterNet's formula) and `σ = (2r + 1)/6`;
/// overlapping Gaussians combine by maximum, so the centre cell is exactly 1. Where two boxes
/// share a centre cell, the later box's offset and size win. With `flip` the boxes are mirrored
/// (`x → input_w − x`), to match a flipped [`Normalize`].
///
/// With a `neighbour_weight` `w > 0`, a box also trains the regression of the cells within
/// `neighbour_radius` `R` of its centre cell (`|dx|, |dy| ≤ R`: the eight around it at 1,
/// 24 at 2) whose centres lie inside it (TTFNet's and FCOS's point: one cell per box gives a
/// small dataset few regression samples; a large box covers more than the 3×3 block): there
/// the offsets are `cx − x`, `cy − y` for cell `(x, y)`, the sizes the box's, and the mask is
/// `w` (below 1, so that the loss still tells centres apart). A centre cell is never taken by
/// a neighbour; where neighbours of two boxes meet, the box of the larger mask keeps the cell
/// (the earlier one where they are equal).
///
/// With `neighbour_cells` `K > 0`, a box with more than `K` such neighbours (`C` of them: a
/// large box at a reach above 1) weighs each `w·K/C` instead of `w`, so that no box's
/// neighbours weigh more than `K·w` together: at reach 3 a box filling the 7×7 block would
/// otherwise weigh 37 centres in the box loss, a box of two cells 1 to 4, and large boxes
/// would crowd small ones out of it. A smaller box's heavier neighbours also win the cells two
/// boxes share, as FCOS gives an ambiguous cell to the smaller box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    pub n: u32,
    pub classes: u32,
    /// The output grids; each box is rendered on the one level [`Levels::level_of`] picks.
    pub levels: Levels,
    pub max_boxes: u32,
    pub record_stride: u32,
    pub meta_offset: u32,
    /// CenterNet's minimum IoU of a box shifted within the radius: 0.7.
    pub min_overlap: f32,
    pub flip: bool,
    /// Regression weight of a centre's neighbour cells, in `[0, 1)`; 0: the centre alone.
    pub neighbour_weight: f32,
    /// How far the neighbours reach from the centre cell, in cells: 1 to
    /// [`MAX_NEIGHBOUR_RADIUS`].
    pub neighbour_radius: u32,
    /// The most neighbour cells a box weighs in full (0: no limit); up to
    /// [`MAX_NEIGHBOUR_CELLS`].
    pub neighbour_cells: u32,
}

/// The largest useful [`Targets::neighbour_cells`]: every cell of
/// [`MAX_NEIGHBOUR_RADIUS`]'s block but the centre, `(2·4 + 1)² − 1`.
pub const MAX_NEIGHBOUR_CELLS: u32 = (2 * MAX_NEIGHBOUR_RADIUS + 1).pow(2) - 1;

/// The farthest [`Targets::neighbour_radius`]: a 9×9 block, more than the largest box of a
/// stride-32 level spans at the usual input sizes.
pub const MAX_NEIGHBOUR_RADIUS: u32 = 4;

impl Targets {
    /// Channels of the target tensor: `classes + 5`.
    pub fn channels(&self) -> u32 {
        self.classes + 5
    }

    pub fn output_len(&self) -> usize {
        self.n as usize * self.channels() as usize * self.levels.total_cells()
    }

    /// Bytes the input must hold: up to the last box of the last record.
    pub fn input_bytes(&self) -> usize {
        (self.n as usize - 1) * self.record_stride as usize
            + self.meta_offset as usize
            + 40
            + 20 * self.max_boxes as usize
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("targets n", self.n), ("targets classes", self.classes)])?;
        self.levels.validate("targets")?;
        if !self.meta_offset.is_multiple_of(4) || !self.record_stride.is_multiple_of(4) {
            return Err(OpError::Invalid(format!(
                "targets meta_offset {} and record_stride {} must be multiples of 4",
                self.meta_offset, self.record_stride
            )));
        }
        let record_part = self.meta_offset as u64 + 40 + 20 * self.max_boxes as u64;
        if self.n > 1 && (self.record_stride as u64) < record_part {
            return Err(OpError::Invalid(format!(
                "targets record_stride {} is smaller than the {record_part} bytes of a record",
                self.record_stride
            )));
        }
        if !(self.min_overlap > 0.0 && self.min_overlap < 1.0) {
            return Err(OpError::Invalid(format!(
                "targets min_overlap {} must be in (0, 1)",
                self.min_overlap
            )));
        }
        if !(0.0..1.0).contains(&self.neighbour_weight) {
            return Err(OpError::Invalid(format!(
                "targets neighbour_weight {} must be in [0, 1)",
                self.neighbour_weight
            )));
        }
        if !(1..=MAX_NEIGHBOUR_RADIUS).contains(&self.neighbour_radius) {
            return Err(OpError::Invalid(format!(
                "targets neighbour_radius {} must be 1 to {MAX_NEIGHBOUR_RADIUS}",
                self.neighbour_radius
            )));
        }
        if self.neighbour_cells > MAX_NEIGHBOUR_CELLS {
            return Err(OpError::Invalid(format!(
                "targets neighbour_cells {} must be at most {MAX_NEIGHBOUR_CELLS}",
                self.neighbour_cells
            )));
        }
        check_fits("targets input", self.input_bytes() as u64)?;
        check_fits("targets output", self.output_len() as u64)
    }
}

/// The detector's loss: focal loss on the heat maps plus L1 on offsets and log sizes at the
/// centres, all divided by `N = max(1, number of centre cells in the batch)`.
///
/// Predictions `n × (classes + 4) × grid_h × grid_w` (heat-map logits, offset x/y, log w/h),
/// targets as [`Targets`] renders them. The loss is the same sum at every cell, so a
/// multi-level output is one `1 × cells` grid here, its sums and `N` over all levels. With `p = sigmoid(logit)` and `y` the target heat:
///
/// - where `y = 1`: `−(1 − p)^alpha · ln p`;
/// - elsewhere: `−(1 − y)^beta · p^alpha · ln(1 − p)`;
///
/// `ln p` and `ln(1 − p)` are computed as `−softplus(∓logit)`, exact and finite for every
/// logit. L1: `offset_weight · Σ m·|Δoffset| + size_weight · Σ m·|Δlog size|` over the cells
/// whose mask `m` is above 0 and both components (the gradient of `|0|` is taken as 0).
/// GIoU: `giou_weight · Σ m·(1 − GIoU)` over the same cells, between the box the cell predicts
/// and its target box, both in the cell's own units (centre at the offset, size
/// `exp(log size)`): it grows with the boxes' misfit relative to their size, on every level
/// alike, and still pulls where they do not overlap ([`giou`]). The mask is 1 at centres and
/// [`Targets::neighbour_weight`] at their neighbours; `N` counts the cells whose mask is
/// exactly 1. The gradient (same shape as the predictions) is zero where the mask is 0 for
/// the four regression channels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CenterLoss {
    pub n: u32,
    pub classes: u32,
    pub grid_h: u32,
    pub grid_w: u32,
    /// 2 in CenterNet.
    pub alpha: f32,
    /// 4 in CenterNet.
    pub beta: f32,
    pub offset_weight: f32,
    pub size_weight: f32,
    pub giou_weight: f32,
}

impl CenterLoss {
    /// The family's loss: `alpha = 2`, `beta = 4`, both L1 weights 1, no GIoU term (it
    /// measured worse on the raccoon split; `train --giou` adds it).
    pub fn det_s(n: u32, classes: u32, grid_h: u32, grid_w: u32) -> Self {
        CenterLoss {
            n,
            classes,
            grid_h,
            grid_w,
            alpha: 2.0,
            beta: 4.0,
            offset_weight: 1.0,
            size_weight: 1.0,
            giou_weight: 0.0,
        }
    }

    /// Elements of the prediction (and gradient) tensor.
    pub fn pred_len(&self) -> usize {
        self.n as usize * (self.classes as usize + 4) * self.grid_h as usize * self.grid_w as usize
    }

    /// Elements of the target tensor (as [`Targets::output_len`]).
    pub fn target_len(&self) -> usize {
        self.n as usize * (self.classes as usize + 5) * self.grid_h as usize * self.grid_w as usize
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[
            ("loss n", self.n),
            ("loss classes", self.classes),
            ("loss grid_h", self.grid_h),
            ("loss grid_w", self.grid_w),
        ])?;
        for (name, v) in [
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("offset_weight", self.offset_weight),
            ("size_weight", self.size_weight),
            ("giou_weight", self.giou_weight),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(OpError::Invalid(format!(
                    "loss {name} is {v}; it must be finite and not negative"
                )));
            }
        }
        check_fits("loss targets", self.target_len() as u64)
    }
}

/// Log sizes are clamped to this magnitude before `exp` in [`giou`] (a box `e^15` cells wide
/// is no box; the clamp keeps the areas finite for any prediction).
pub const GIOU_MAX_LOG_SIZE: f32 = 15.0;

/// `1 − GIoU` of a predicted and a target box, each `[centre x, centre y, log w, log h]`
/// (sizes `exp(log)`), and its gradient with respect to the prediction. With `I` the
/// intersection, `U` the union and `C` the smallest enclosing box's area,
/// `1 − GIoU = 2 − I/U − U/C` (Rezatofighi et al., 2019). At equal edges the gradient takes
/// the target's edge as the one that binds. The Vulkan kernels transcribe this function
/// (`shaders/loss.glsl`); keep the two in step.
pub fn giou(p: [f32; 4], t: [f32; 4]) -> (f32, [f32; 4]) {
    let size = |l: f32| l.clamp(-GIOU_MAX_LOG_SIZE, GIOU_MAX_LOG_SIZE).exp();
    let (pw, ph, tw, th) = (size(p[2]), size(p[3]), size(t[2]), size(t[3]));
    // Per axis: the intersection's and the enclosure's extents, and which of their edges are
    // the prediction's.
    let axis = |pc: f32, ps: f32, tc: f32, ts: f32| {
        let (p0, p1, t0, t1) = (pc - ps / 2.0, pc + ps / 2.0, tc - ts / 2.0, tc + ts / 2.0);
        let (i_lo, i_hi) = (p0 > t0, p1 < t1);
        let (e_lo, e_hi) = (p0 < t0, p1 > t1);
        let inter = (if i_hi { p1 } else { t1 }) - (if i_lo { p0 } else { t0 });
        let encl = (if e_hi { p1 } else { t1 }) - (if e_lo { p0 } else { t0 });
        (inter, encl, [i_lo, i_hi, e_lo, e_hi])
    };
    let (ix, ex, fx) = axis(p[0], pw, t[0], tw);
    let (iy, ey, fy) = axis(p[1], ph, t[1], th);
    let (ixp, iyp) = (ix.max(0.0), iy.max(0.0));
    let inter = ixp * iyp;
    let area = pw * ph;
    let union = area + tw * th - inter;
    let encl = ex * ey;
    let loss = 2.0 - inter / union - union / encl;
    // ∂L/∂I (U = A_p + A_t − I), ∂L/∂A_p, ∂L/∂C.
    let d_inter = -(union + inter) / (union * union) + 1.0 / encl;
    let d_area = inter / (union * union) - 1.0 / encl;
    let d_encl = union / (encl * encl);
    // ∂L/∂(low edge), ∂L/∂(high edge) of the prediction on one axis.
    let edges = |i: f32, other_i: f32, other_e: f32, f: [bool; 4]| {
        let di = if i > 0.0 { d_inter * other_i } else { 0.0 };
        let de = d_encl * other_e;
        let lo = -(if f[0] { di } else { 0.0 }) - if f[2] { de } else { 0.0 };
        let hi = (if f[1] { di } else { 0.0 }) + if f[3] { de } else { 0.0 };
        (lo, hi)
    };
    let (gx0, gx1) = edges(ix, iyp, ey, fx);
    let (gy0, gy1) = edges(iy, ixp, ex, fy);
    // Edges are centre ∓ size/2 with size = e^log: ∂edge/∂log = ∓size/2.
    let grad = [
        gx0 + gx1,
        gy0 + gy1,
        (gx1 - gx0) * pw / 2.0 + d_area * area,
        (gy1 - gy0) * ph / 2.0 + d_area * area,
    ];
    (loss, grad)
}

/// The exponential moving average of `len` parameters, updated after each optimizer step:
/// `e = d·e + (1 − d)·w`, with the decay `d` of the step read from the hyper-parameter tensor
/// (see [`ema_decay`]). Evaluation, export and serving use the average, which is smoother
/// than the last step's weights (they move with every batch's noise).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ema {
    pub len: u32,
}

impl Ema {
    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("ema len", self.len)])
    }
}

/// Decay of the weight average at optimizer step `step` (from 1):
/// `min(EMA_MAX_DECAY, (1 + step) / (10 + step))` (the schedule of TensorFlow's
/// `ExponentialMovingAverage` with `num_updates`). Early steps, whose weights are far from
/// trained, are soon forgotten; later the average spans about the last tenth of the run,
/// up to `1 / (1 − EMA_MAX_DECAY)` steps: a horizon that suits a 300-step run and a
/// 30 000-step one without a setting.
pub fn ema_decay(step: u64) -> f32 {
    let s = step as f64;
    ((1.0 + s) / (10.0 + s)).min(EMA_MAX_DECAY as f64) as f32
}

/// The longest horizon of the weight average: about 5 000 steps.
pub const EMA_MAX_DECAY: f32 = 0.9998;

/// One gradient's share of the global gradient norm: `sums[slot] = Σ g²` over its `len`
/// values, into the sums tensor of a [`GradClip`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SumSquares {
    pub len: u32,
    /// Which of the clip's sums it writes (`0..tensors`).
    pub slot: u32,
    /// The clip's [`GradClip::tensors`].
    pub tensors: u32,
}

impl SumSquares {
    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[
            ("sum-squares len", self.len),
            ("sum-squares tensors", self.tensors),
        ])
    }
}

/// Global gradient-norm clipping, PyTorch's `clip_grad_norm_`: from the sums of squares of
/// `tensors` gradients ([`SumSquares`]), `norm = √Σ` and `scale = min(1, max_norm / (norm +
/// 10⁻⁶))`, by which every optimizer step of that training step multiplies its gradient. One
/// batch whose gradient is far larger than usual (a burst of hard examples, a badly labelled
/// photo) then moves the weights no further than `max_norm` allows, instead of throwing a
/// high learning rate's run off its track.
///
/// The sums tensor holds `[norm, scale, sums...]` ([`GradClip::sums_len`]): the host reads
/// the first two after each step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradClip {
    pub tensors: u32,
    pub max_norm: f32,
}

/// Where a [`GradClip`]'s sums tensor holds the norm before clipping, the scale, and the
/// first gradient's sum of squares.
pub const CLIP_NORM: usize = 0;
pub const CLIP_SCALE: usize = 1;
pub const CLIP_SUMS: usize = 2;

impl GradClip {
    /// Floats of its sums tensor.
    pub fn sums_len(&self) -> usize {
        CLIP_SUMS + self.tensors as usize
    }

    /// The factor gradients of global norm `norm` are multiplied by.
    pub fn scale(&self, norm: f32) -> f32 {
        (self.max_norm / (norm + 1e-6)).min(1.0)
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("clip tensors", self.tensors)])?;
        if !(self.max_norm.is_finite() && self.max_norm > 0.0) {
            return Err(OpError::Invalid(format!(
                "clip max_norm {} must be finite and positive",
                self.max_norm
            )));
        }
        Ok(())
    }
}

/// SGD with momentum and L2 weight decay, PyTorch's formulation, over `len` parameters:
/// `g = grad + weight_decay·w; v = momentum·v + g; w = w − lr·v` (`v` starts at 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdMomentum {
    pub len: u32,
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
}

impl SgdMomentum {
    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("sgd len", self.len)])?;
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(OpError::Invalid(format!(
                "sgd lr {} must be finite and not negative",
                self.lr
            )));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(OpError::Invalid(format!(
                "sgd momentum {} must be in [0, 1)",
                self.momentum
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(OpError::Invalid(format!(
                "sgd weight_decay {} must be finite and not negative",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// AdamW (decoupled weight decay), PyTorch's formulation, over `len` parameters, at `step`
/// (1 for the first update):
/// `w = w·(1 − lr·weight_decay); m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²;
/// w = w − lr·(m/c1)/(√(v/c2) + eps)` with `c1 = 1 − β1^step`, `c2 = 1 − β2^step`
/// (`m`, `v` start at 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub len: u32,
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub step: u32,
}

impl AdamW {
    /// The bias corrections `(1 − β1^step, 1 − β2^step)`, computed in `f64` (a shader gets them
    /// as push constants rather than raising to a power per element).
    pub fn bias_corrections(&self) -> (f32, f32) {
        let t = self.step as i32;
        (
            (1.0 - (self.beta1 as f64).powi(t)) as f32,
            (1.0 - (self.beta2 as f64).powi(t)) as f32,
        )
    }

    /// The `hyper` tensor of this step ([`super::recording::HYPER_LEN`]: `[lr, step, c1, c2,
    /// ema_decay, grad_scale]`), the one place its layout is written: what the host uploads
    /// before each optimizer step (the gradients unscaled: a clip step overwrites the 1).
    pub fn hyper(&self) -> [f32; super::recording::HYPER_LEN] {
        let (c1, c2) = self.bias_corrections();
        [
            self.lr,
            self.step as f32,
            c1,
            c2,
            ema_decay(self.step.into()),
            1.0,
        ]
    }

    /// A `hyper` that leaves the parameters and their average as they are (learning rate 0,
    /// decay 1): for steps that only measure.
    pub fn frozen_hyper() -> [f32; super::recording::HYPER_LEN] {
        [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("adamw len", self.len), ("adamw step", self.step)])?;
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(OpError::Invalid(format!(
                "adamw lr {} must be finite and not negative",
                self.lr
            )));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(OpError::Invalid(format!(
                    "adamw {name} {b} must be in [0, 1)"
                )));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(OpError::Invalid(format!(
                "adamw eps {} must be positive",
                self.eps
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(OpError::Invalid(format!(
                "adamw weight_decay {} must be finite and not negative",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// Detections from the model's output (no NMS).
///
/// Input `n × (classes + 4) × cells` as [`CenterLoss`] describes, the cells of every level
/// ([`Levels`]). A heat-map cell is a *peak* when its logit equals the maximum of its 3×3
/// neighbourhood on the same class channel and level (cells outside the level's grid ignored;
/// the sigmoid is monotonic, so this is the max-pool test on scores, without the rounding that
/// can make distinct scores equal). Every peak with `sigmoid(logit) >= threshold` is a
/// candidate; the `top_k` highest scores per image are kept, ordered by score, ties by the
/// cell's index in the image's output (class, level, y, x). A detection at cell `(gx, gy)` of a
/// level of stride `stride` has centre `((gx + offset_x)·stride, (gy + offset_y)·stride)` and
/// size `(exp(log_w)·stride, exp(log_h)·stride)`, in pixels of the input image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decode {
    pub n: u32,
    pub classes: u32,
    pub levels: Levels,
    pub threshold: f32,
    pub top_k: u32,
}

impl Decode {
    pub fn input_len(&self) -> usize {
        self.n as usize * (self.classes as usize + 4) * self.levels.total_cells()
    }

    /// Detection slots: `n × top_k` (each image's count says how many are filled).
    pub fn output_len(&self) -> usize {
        self.n as usize * self.top_k as usize
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[
            ("decode n", self.n),
            ("decode classes", self.classes),
            ("decode top_k", self.top_k),
        ])?;
        self.levels.validate("decode")?;
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(OpError::Invalid(format!(
                "decode threshold {} must be in [0, 1]",
                self.threshold
            )));
        }
        check_fits("decode input", self.input_len() as u64)
    }
}

/// Copies `rows` rows of `len` floats from `src` (row `r` at `src_offset + r·src_stride`) to
/// `dst` (at `dst_offset + r·dst_stride`); nothing else of `dst` is written. It gathers the
/// output levels of a multi-scale head into one `n × channels × cells` tensor (each level's
/// `n·channels` planes into their span of every plane), and scatters the gradient back.
/// `src_size` and `dst_size` are the two tensors' lengths, which the rows must fit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCopy {
    pub rows: u32,
    pub len: u32,
    pub src_stride: u32,
    pub src_offset: u32,
    pub dst_stride: u32,
    pub dst_offset: u32,
    pub src_size: u32,
    pub dst_size: u32,
}

impl RowCopy {
    /// Rows of `len` packed in a `rows·len` source, into a destination of `dst_size` at
    /// `dst_stride` from `dst_offset` (a level's output into the whole output).
    pub fn gather(rows: u32, len: u32, dst_stride: u32, dst_offset: u32, dst_size: u32) -> Self {
        RowCopy {
            rows,
            len,
            src_stride: len,
            src_offset: 0,
            dst_stride,
            dst_offset,
            src_size: rows * len,
            dst_size,
        }
    }

    /// The copy the other way: what this one wrote, back where it came from.
    pub fn reversed(&self) -> Self {
        RowCopy {
            rows: self.rows,
            len: self.len,
            src_stride: self.dst_stride,
            src_offset: self.dst_offset,
            dst_stride: self.src_stride,
            dst_offset: self.src_offset,
            src_size: self.dst_size,
            dst_size: self.src_size,
        }
    }

    /// Elements `src` holds.
    pub fn src_len(&self) -> usize {
        self.src_size as usize
    }

    /// Elements `dst` holds.
    pub fn dst_len(&self) -> usize {
        self.dst_size as usize
    }

    fn extent(rows: u32, len: u32, stride: u32, offset: u32) -> u64 {
        u64::from(offset) + u64::from(rows.saturating_sub(1)) * u64::from(stride) + u64::from(len)
    }

    /// Whether the copy writes every element of `dst`.
    pub fn writes_whole(&self) -> bool {
        self.dst_offset == 0
            && self.dst_stride == self.len
            && u64::from(self.rows) * u64::from(self.len) == u64::from(self.dst_size)
    }

    pub fn validate(&self) -> Result<(), OpError> {
        check_nonzero(&[("copy rows", self.rows), ("copy len", self.len)])?;
        if self.src_stride < self.len || self.dst_stride < self.len {
            return Err(OpError::Invalid(format!(
                "copy: rows of {} overlap (strides {} and {})",
                self.len, self.src_stride, self.dst_stride
            )));
        }
        let src = Self::extent(self.rows, self.len, self.src_stride, self.src_offset);
        let dst = Self::extent(self.rows, self.len, self.dst_stride, self.dst_offset);
        if src > u64::from(self.src_size) || dst > u64::from(self.dst_size) {
            return Err(OpError::Invalid(format!(
                "copy: the rows reach element {src} of a {}-element source and {dst} of a \
                 {}-element destination",
                self.src_size, self.dst_size
            )));
        }
        Ok(())
    }
}

/// One detection: six 4-byte words, the layout a shader writes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Detection {
    pub class: u32,
    pub score: f32,
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_shapes_of_det_s_layers() {
        let stem = Conv2d::dense(1, 3, 128, 128, 16, 3, 2, true);
        assert_eq!((stem.out_h(), stem.out_w()), (64, 64));
        assert_eq!(stem.weight_len(), 16 * 3 * 9);
        assert_eq!(stem.kind(), ConvKind::Dense);
        assert_eq!(stem.flops(), 2 * 16 * 64 * 64 * 27);
        stem.validate().unwrap();

        let dw = Conv2d::depthwise(2, 16, 64, 64, 3, 2, true);
        assert_eq!((dw.out_h(), dw.out_w(), dw.pad), (32, 32, 1));
        assert_eq!(dw.weight_len(), 16 * 9);
        assert_eq!(dw.kind(), ConvKind::Depthwise);
        assert_eq!(dw.output_len(), 2 * 16 * 32 * 32);

        let pw = Conv2d::pointwise(1, 16, 32, 32, 32, false);
        assert_eq!((pw.out_h(), pw.out_w(), pw.pad), (32, 32, 0));
        assert_eq!(pw.kind(), ConvKind::Pointwise);

        let odd = Conv2d::dense(1, 4, 7, 5, 3, 3, 2, false);
        assert_eq!((odd.out_h(), odd.out_w()), (4, 3));
        let grouped = Conv2d {
            groups: 2,
            ..Conv2d::dense(1, 4, 7, 5, 6, 3, 1, false)
        };
        assert_eq!(grouped.kind(), ConvKind::Grouped);
        assert_eq!(grouped.weight_len(), 6 * 2 * 9);
    }

    #[test]
    fn conv_validation_names_the_problem() {
        let ok = Conv2d::dense(1, 4, 8, 8, 6, 3, 1, true);
        ok.validate().unwrap();
        let e = Conv2d { groups: 3, ..ok }.validate().unwrap_err();
        assert!(e.to_string().contains("groups 3"), "{e}");
        let e = Conv2d { stride: 0, ..ok }.validate().unwrap_err();
        assert_eq!(
            e,
            OpError::Zero {
                field: "conv stride"
            }
        );
        assert_eq!(e.to_string(), "conv stride is 0; it must be at least 1");
        let e = Conv2d { pad: 3, ..ok }.validate().unwrap_err();
        assert!(e.to_string().contains("pad"), "{e}");
        let e = Conv2d {
            h: 1,
            kernel: 5,
            pad: 1,
            ..ok
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let e = Conv2d {
            n: 1 << 20,
            c_in: 1 << 12,
            groups: 1,
            ..ok
        }
        .validate()
        .unwrap_err();
        assert!(
            matches!(e, OpError::TooLarge { what: "conv input", len } if len > MAX_ELEMENTS),
            "{e}"
        );
    }

    #[test]
    fn other_ops_validate() {
        Upsample2x {
            n: 1,
            c: 2,
            h: 3,
            w: 4,
        }
        .validate()
        .unwrap();
        let norm = Normalize {
            n: 2,
            h: 4,
            w: 4,
            record_stride: 48,
            flip: false,
        };
        norm.validate().unwrap();
        assert_eq!(norm.input_bytes(), 96);
        assert!(Normalize {
            record_stride: 47,
            ..norm
        }
        .validate()
        .is_err());
        let t = Targets {
            n: 2,
            classes: 2,
            levels: Levels::single(16, 16, 8),
            max_boxes: 32,
            record_stride: 53248,
            meta_offset: 49152,
            min_overlap: 0.7,
            flip: false,
            neighbour_weight: 0.0,
            neighbour_radius: 1,
            neighbour_cells: 0,
        };
        t.validate().unwrap();
        assert_eq!(t.output_len(), 2 * 7 * 256);
        for radius in [0, MAX_NEIGHBOUR_RADIUS + 1] {
            let e = Targets {
                neighbour_radius: radius,
                ..t
            }
            .validate()
            .unwrap_err();
            assert!(e.to_string().contains("neighbour_radius"), "{e}");
        }
        let e = Targets {
            neighbour_cells: 81,
            ..t
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("neighbour_cells 81"), "{e}");
        assert!(Targets {
            meta_offset: 2,
            ..t
        }
        .validate()
        .is_err());
        assert!(Targets {
            min_overlap: 1.0,
            ..t
        }
        .validate()
        .is_err());
        CenterLoss::det_s(2, 2, 16, 16).validate().unwrap();
        assert!(CenterLoss {
            alpha: f32::NAN,
            ..CenterLoss::det_s(2, 2, 16, 16)
        }
        .validate()
        .is_err());
        let adam = AdamW {
            len: 10,
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 2,
        };
        adam.validate().unwrap();
        let (c1, c2) = adam.bias_corrections();
        // 1 − β² with β as the f32 the op holds (0.9f32 is not 0.9): 0.19 and 0.001999 to
        // within f32 rounding of those values.
        assert!((c1 / 0.19 - 1.0).abs() < 1e-6, "{c1}");
        assert!((c2 / 0.001999 - 1.0).abs() < 2e-5, "{c2}");
        assert!(AdamW { step: 0, ..adam }.validate().is_err());
        assert!(SgdMomentum {
            len: 1,
            lr: 0.1,
            momentum: 1.0,
            weight_decay: 0.0
        }
        .validate()
        .is_err());
        let d = Decode {
            n: 1,
            classes: 2,
            levels: Levels::single(16, 16, 8),
            threshold: 0.3,
            top_k: 100,
        };
        d.validate().unwrap();
        assert!(Decode { top_k: 0, ..d }.validate().is_err());
        assert_eq!(std::mem::size_of::<Detection>(), 24);
    }
}
