//! The table of GPU kernels: every compute shader fulcrum embeds, declared once here.
//!
//! A kernel is one GLSL file `shaders/NAME.comp`, compiled by `tools/scripts/build-shaders.sh`
//! into the committed `shaders/NAME.spv` and embedded with `include_bytes!` (building fulcrum
//! needs no shader compiler). Its entry says what the pipeline needs to know: the buffers it
//! binds (set 0, bindings `0..bindings`: storage buffers, or uniform texel buffers where
//! [`KernelInfo::texels`] says so), its push-constant bytes, its workgroup
//! size and which specialisation constants override it, and its shared memory.
//!
//! Kernels respect the weakest target fulcrum runs on: at most [`MAX_INVOCATIONS`]
//! invocations per workgroup and [`MAX_SHARED_BYTES`] of shared memory, and no fp16
//! arithmetic required: fp16 kernels are variants ([`KernelInfo::fp16`]) used only where the
//! device offers `shaderFloat16` and the engine was asked for them. Likewise the subgroup
//! variants ([`KernelInfo::subgroups`], [`Kernel::subgroup_variant`]), used where the
//! device's subgroups have arithmetic in compute shaders. The pipeline refuses a workgroup size above the limit; a unit test
//! checks every table entry.
//!
//! To add a kernel: write `shaders/NAME.comp`, run the script, add a variant to [`Kernel`]
//! and its entry in [`Kernel::info`] (and in [`Kernel::ALL`]).

use std::sync::OnceLock;

/// Workgroup invocations every kernel must stay within (Raspberry Pi's V3D: 256).
pub const MAX_INVOCATIONS: u32 = 256;
/// Shared memory every kernel must stay within (V3D: 16 KiB).
pub const MAX_SHARED_BYTES: u32 = 16 * 1024;

/// Declares [`Kernel`] with [`Kernel::ALL`] and [`Kernel::info`] from one list, each kernel a
/// variant and its table entry (a `static` [`KernelInfo`] below): a new kernel is a line here,
/// its entry and its shader, and `every_shader_file_is_in_the_table` checks that none is
/// missing.
macro_rules! kernels {
    ($(#[$outer:meta])* pub enum Kernel {
        $($(#[$doc:meta])* $variant:ident => $info:ident,)*
    }) => {
        $(#[$outer])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $($(#[$doc])* $variant,)*
        }

        impl Kernel {
            /// Every kernel, in table order.
            pub const ALL: [Kernel; [$(stringify!($variant)),*].len()] = [$(Kernel::$variant),*];

            pub fn info(self) -> &'static KernelInfo {
                match self {
                    $(Kernel::$variant => &$info,)*
                }
            }
        }
    };
}

kernels! {
/// A GPU kernel. The comments give the bindings in order (read-only unless marked `rw` or
/// `w`) and the push constants; the shader files say the rest. Every convolution kernel takes
/// the same 72-byte push block (`shaders/conv_push.glsl`, built by
/// [`super::lower::conv_push`]).
pub enum Kernel {
    /// `y[i] = a * x[i] + y[i]` for `i < n`: bindings `x` (read), `y` (read-write); push
    /// constants `{ n: u32, a: f32 }`; workgroup size x = specialisation constant 0
    /// (default 64). The engine's proof kernel.
    Saxpy => SAXPY,
    /// Dense / grouped conv + bias + ReLU, direct (a pixel and eight output channels an
    /// invocation): `x, w, b, y (w)`.
    Conv2d => CONV2D,
    /// [`Kernel::Conv2d`] with four pixels of a row an invocation, for GPUs at batches with
    /// many pixels: the same bindings and push block; grid over blocks of four pixels.
    Conv2dQuad => CONV2D_QUAD,
    /// [`Kernel::Conv2d`] reading the records as [`Kernel::Normalize`] would normalise them
    /// (the stem, its normalisation folded in): `records, w, b, y (w)`; the push block's
    /// `record_stride` and `flip` are the normalisation's.
    Conv2dRgb => CONV2D_RGB,
    /// [`Kernel::Conv2dQuad`] reading the records, as [`Kernel::Conv2dRgb`].
    Conv2dQuadRgb => CONV2D_QUAD_RGB,
    /// [`Kernel::Conv2d`] with f16 inputs, weights and products (f32 sums), for devices with
    /// `shaderFloat16` when fp16 variants are asked for ([`Kernel::fp16_variant`]), as are
    /// the three below: the same bindings, push block and grid.
    Conv2dF16 => CONV2D_F16,
    /// [`Kernel::Conv2dQuad`] in f16, as [`Kernel::Conv2dF16`].
    Conv2dQuadF16 => CONV2D_QUAD_F16,
    /// [`Kernel::Conv2dRgb`] in f16, as [`Kernel::Conv2dF16`].
    Conv2dRgbF16 => CONV2D_RGB_F16,
    /// [`Kernel::Conv2dQuadRgb`] in f16, as [`Kernel::Conv2dF16`].
    Conv2dQuadRgbF16 => CONV2D_QUAD_RGB_F16,
    /// [`Kernel::Conv2d`] with eight pixels of a row an invocation, for CPU-type devices: the
    /// same bindings and push block; grid over blocks of eight pixels.
    Conv2dDirect => CONV2D_DIRECT,
    /// [`Kernel::Conv2dDirect`] reading the records, as [`Kernel::Conv2dRgb`].
    Conv2dDirectRgb => CONV2D_DIRECT_RGB,
    /// Pointwise (1×1) conv + bias + ReLU (+ a residual, where the push block's `skip` says
    /// so), a tiled GEMM: `x, w, b, y (w), skip`.
    Pointwise => POINTWISE,
    /// [`Kernel::Pointwise`] with f16 tiles and products (f32 sums), for devices with
    /// `shaderFloat16` when fp16 variants are asked for: the same bindings and push block.
    PointwiseF16 => POINTWISE_F16,
    /// [`Kernel::Pointwise`] summed straight from the buffers, with no shared memory or
    /// barrier, for CPU-type devices: the same bindings and push block; a workgroup covers
    /// [`POINTWISE_DIRECT_PIXELS`] pixels (twice the tiled kernel's) with a quarter of its
    /// invocations, each with 64 outputs.
    PointwiseDirect => POINTWISE_DIRECT,
    /// [`Kernel::PointwiseDirect`] reading its input and weights as vec4 texels and storing
    /// vec4s, where the plane and the input channels are multiples of four
    /// ([`pointwise_direct4_fits`]): the same bindings, push block and grid.
    PointwiseDirect4 => POINTWISE_DIRECT4,
    /// [`Kernel::Pointwise`] with one output per invocation, for layers whose tiled grid is
    /// too small to fill a GPU (batch-1 inference): the same bindings and push block; grid
    /// (⌈N/64⌉, ⌈M/4⌉, n) ([`POINTWISE_THIN_GROUP`]).
    PointwiseThin => POINTWISE_THIN,
    /// [`Kernel::PointwiseThin`] with f16 products (f32 sums), as [`Kernel::PointwiseF16`].
    PointwiseThinF16 => POINTWISE_THIN_F16,
    /// Input gradient of dense / grouped / pointwise convs: `w, y, gy, gx (w)`.
    Conv2dGradInput => CONV2D_GRAD_INPUT,
    /// [`Kernel::Conv2dGradInput`] summed straight from the buffers, with no shared memory or
    /// barrier, for CPU-type devices: the same bindings, push block and grid (a quarter of the
    /// invocations, each with four times the outputs).
    Conv2dGradInputDirect => CONV2D_GRAD_INPUT_DIRECT,
    /// [`Kernel::Conv2dGradInputDirect`] for pointwise convs whose plane and input channels
    /// are multiples of four ([`pointwise_direct4_fits`]), reading vec4 texels: the same
    /// bindings, push block and grid.
    Conv2dGradInputDirect4 => CONV2D_GRAD_INPUT_DIRECT4,
    /// Weight and bias gradients of dense / grouped / pointwise convs, split over the batch:
    /// `x, y, gy, partial (w), gw (w), gb (w)`.
    Conv2dGradWeight => CONV2D_GRAD_WEIGHT,
    /// [`Kernel::Conv2dGradWeight`] for CPU-type devices: 64 invocations over the terms, each
    /// summing a block of outputs in registers, one barrier at the end. The same bindings and
    /// push block; its own grid ([`CONV_GRAD_WEIGHT_DIRECT_TILE`]) and parts.
    Conv2dGradWeightDirect => CONV2D_GRAD_WEIGHT_DIRECT,
    /// [`Kernel::Conv2dGradWeightDirect`] for pointwise convs whose plane is a multiple of
    /// four, reading four terms a fetch (vec4 texels): the same bindings, push block, grid
    /// and parts.
    Conv2dGradWeightDirect4 => CONV2D_GRAD_WEIGHT_DIRECT4,
    /// Adds the split partial weight / bias gradients: `partial, gw (w), gb (w)`. A
    /// workgroup per [`CONV_GRAD_REDUCE_BLOCK`] sums, eight lanes sharing the splits.
    Conv2dGradReduce => CONV2D_GRAD_REDUCE,
    /// [`Kernel::Conv2dGradReduce`] for CPU-type devices: one invocation per sum walks every
    /// split, no shared memory or barrier. The same bindings and push block; a linear grid.
    Conv2dGradReduceDirect => CONV2D_GRAD_REDUCE_DIRECT,
    /// Depthwise conv + bias + ReLU, direct: `x, w, b, y (w)`.
    Depthwise => DEPTHWISE,
    /// [`Kernel::Depthwise`] with f16 inputs, weights and products (f32 sums), as
    /// [`Kernel::Conv2dF16`].
    DepthwiseF16 => DEPTHWISE_F16,
    /// [`Kernel::Depthwise`] for CPU-type devices, reading its inputs as texel buffers: the
    /// same bindings, push block and grid.
    DepthwiseDirect => DEPTHWISE_DIRECT,
    /// Input gradient of a depthwise conv: `w, y, gy, gx (w)`.
    DepthwiseGradInput => DEPTHWISE_GRAD_INPUT,
    /// [`Kernel::DepthwiseGradInput`] for CPU-type devices, reading its inputs as texel
    /// buffers: the same bindings, push block and grid.
    DepthwiseGradInputDirect => DEPTHWISE_GRAD_INPUT_DIRECT,
    /// Weight and bias gradients of a depthwise conv: `x, y, gy, partial (w), gw (w), gb (w)`.
    DepthwiseGradWeight => DEPTHWISE_GRAD_WEIGHT,
    /// The bias gradient alone of any conv whose weight is frozen: `y, gy, gb (w)`; the conv
    /// push block; grid `(c_out, 1, 1)`.
    ConvGradBias => CONV_GRAD_BIAS,
    /// [`Kernel::DepthwiseGradWeight`] adding its workgroup's sums by subgroup operations
    /// (`shaders/workgroup_sum.glsl`): the same bindings, push block and grid.
    DepthwiseGradWeightSubgroup => DEPTHWISE_GRAD_WEIGHT_SUBGROUP,
    /// [`Kernel::DepthwiseGradWeight`] for CPU-type devices: a workgroup per channel and part,
    /// every tap at once, one barrier. The same bindings and push block; grid `(c, 1,
    /// splits)`; kernels up to [`DEPTHWISE_DIRECT_MAX_TAPS`] taps.
    DepthwiseGradWeightDirect => DEPTHWISE_GRAD_WEIGHT_DIRECT,
    /// `out = a + b`: `a, b, out (w)`; push `{ len }`.
    Add => ADD,
    /// [`Kernel::Add`] for CPU-type devices where `len` is a multiple of four
    /// ([`add_direct4_fits`]): the inputs read as vec4 texels, four sums an invocation. The
    /// same bindings and push block; grid over `len / 4`.
    AddDirect4 => ADD_DIRECT4,
    /// `dst += src`: `dst (rw), src`; push `{ len }`.
    AddAssign => ADD_ASSIGN,
    /// [`Kernel::AddAssign`] as [`Kernel::AddDirect4`]: `dst (w), src, dst` (the first read
    /// as vec4 texels through binding 2); the same push block; grid over `len / 4`.
    AddAssignDirect4 => ADD_ASSIGN_DIRECT4,
    /// `dst = mask_by > 0 ? dst + src : 0`: `dst (rw), src, mask_by`; push `{ len }` (a
    /// gradient store `compute::fusion::grad_stores` allows).
    MaskedAddAssign => MASKED_ADD_ASSIGN,
    /// [`Kernel::MaskedAddAssign`] as [`Kernel::AddAssignDirect4`]: `dst (w), src, dst,
    /// mask_by` (all but the first read as vec4 texels); the same push block; grid over
    /// `len / 4`.
    MaskedAddAssignDirect4 => MASKED_ADD_ASSIGN_DIRECT4,
    /// Nearest ×2 upsample (+ a residual where `skip` is 1): `x, y (w), skip`; push `{ n, c,
    /// h, w, skip }`.
    Upsample => UPSAMPLE,
    /// Its backward (sum of four): `gy, gx (w)`; push `{ n, c, h, w }`.
    UpsampleGrad => UPSAMPLE_GRAD,
    /// Rows from one tensor into another at their strides ([`crate::compute::ops::RowCopy`]):
    /// `src, dst (w)`; push `{ rows, len, src_stride, src_offset, dst_stride, dst_offset }`.
    RowCopy => ROW_COPY,
    /// u8 HWC records → f32 NCHW `/255`: `records, out (w)`; push `{ n, h, w, record_stride,
    /// flip }`.
    Normalize => NORMALIZE,
    /// CenterNet targets from the records' boxes: `records, out (rw)`; push `{ n, classes,
    /// levels (six words), max_boxes, record_stride, meta_offset, min_overlap, flip,
    /// neighbour_weight, neighbour_radius, neighbour_cells }`.
    Targets => TARGETS,
    /// Loss, first pass: `pred, target, partial (w), loss (w)`; push `{ n, classes, grid_h,
    /// grid_w, alpha, beta, offset_weight, size_weight, giou_weight, parts, cells_per_part }`.
    LossPartial => LOSS_PARTIAL,
    /// [`Kernel::LossPartial`] by subgroup operations, as
    /// [`Kernel::DepthwiseGradWeightSubgroup`].
    LossPartialSubgroup => LOSS_PARTIAL_SUBGROUP,
    /// Loss, second pass: `partial, loss (w)`; the same push block; one invocation.
    LossFinish => LOSS_FINISH,
    /// Loss gradient: `pred, target, loss, grad (w)`; the same push block.
    LossGrad => LOSS_GRAD,
    /// [`Kernel::LossFinish`] and [`Kernel::LossGrad`] in one pass, for a loss in parts whose
    /// gradient follows it: `pred, target, partial, loss (w), grad (w)`; the same push block;
    /// [`Kernel::LossGrad`]'s grid.
    LossGradFinish => LOSS_GRAD_FINISH,
    /// Sums of squares of up to [`SUM_SQUARES_GROUP`] gradients, a workgroup each, for
    /// gradient-norm clipping: `g0, g1, g2, g3, sums (rw)`; push `{ len0..len3, first_slot }`.
    SumSquares => SUM_SQUARES,
    /// [`Kernel::SumSquares`] by subgroup operations, as
    /// [`Kernel::DepthwiseGradWeightSubgroup`].
    SumSquaresSubgroup => SUM_SQUARES_SUBGROUP,
    /// Gradient-norm clipping from the sums: `sums (rw), hyper (rw)`; push `{ tensors,
    /// max_norm }`; one workgroup.
    ClipGrad => CLIP_GRAD,
    /// AdamW: `param (rw), grad, m (rw), v (rw), hyper`; push `{ len, beta1, beta2, eps,
    /// weight_decay }`.
    AdamW => ADAMW,
    /// Weight average: `ema (rw), param, hyper`; push `{ len }`.
    Ema => EMA,
    /// [`Kernel::AdamW`] then [`Kernel::Ema`] of the same tensor in one pass: AdamW's
    /// bindings and push block, then `ema (rw)`.
    AdamWEma => ADAMW_EMA,
    /// SGD with momentum: `param (rw), grad, velocity (rw), hyper`; push `{ len, momentum,
    /// weight_decay }`.
    Sgd => SGD,
    /// Peak decode + top-K: `pred, dets (w), counts (w)`; push `{ n, classes, levels (six
    /// words, [`crate::compute::ops::Levels::words`]), threshold, top_k }`.
    Decode => DECODE,
    /// A camera frame to the letterboxed RGB record (the frame pass on the GPU, see
    /// [`super::frames`]): `frame, windows, records (w)`; push [`FRAME_PUSH_BYTES`]
    /// (`shaders/frame_pass.comp`); a workgroup writes 16 × 4 quads of output pixels.
    FramePass => FRAME_PASS,
}
}

/// How a kernel's texel bindings are viewed ([`KernelInfo::texels`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TexelFormat {
    /// One float a texel (`R32_SFLOAT`).
    F32,
    /// Four floats a texel (`R32G32B32A32_SFLOAT`): `texelFetch` returns a vec4; the views
    /// cover whole texels, so a buffer's last `len % 4` floats are out of its reach.
    F32x4,
    /// One byte a texel (`R8_UINT`, a `usamplerBuffer`): the records' pixels.
    U8,
}

impl TexelFormat {
    pub fn vk(self) -> ash::vk::Format {
        match self {
            TexelFormat::F32 => ash::vk::Format::R32_SFLOAT,
            TexelFormat::F32x4 => ash::vk::Format::R32G32B32A32_SFLOAT,
            TexelFormat::U8 => ash::vk::Format::R8_UINT,
        }
    }

    /// Bytes a texel.
    pub fn bytes(self) -> u64 {
        match self {
            TexelFormat::F32 => 4,
            TexelFormat::F32x4 => 16,
            TexelFormat::U8 => 1,
        }
    }
}

impl KernelInfo {
    /// How `binding` is viewed, if it is a texel binding.
    pub fn texel_format(&self, binding: u32) -> Option<TexelFormat> {
        if self.texels & (1 << binding) == 0 {
            None
        } else if self.texels4 & (1 << binding) != 0 {
            Some(TexelFormat::F32x4)
        } else if self.texels_u8 & (1 << binding) != 0 {
            Some(TexelFormat::U8)
        } else {
            Some(TexelFormat::F32)
        }
    }

    /// The descriptor type of `binding`.
    pub fn descriptor_type(&self, binding: u32) -> ash::vk::DescriptorType {
        match self.texel_format(binding) {
            Some(_) => ash::vk::DescriptorType::UNIFORM_TEXEL_BUFFER,
            None => ash::vk::DescriptorType::STORAGE_BUFFER,
        }
    }
}

/// What the pipeline needs to know about a kernel.
#[derive(Debug)]
pub struct KernelInfo {
    pub name: &'static str,
    /// The SPIR-V, as committed in `shaders/NAME.spv`.
    pub spirv: &'static [u8],
    /// Buffers at set 0, bindings `0..bindings`: storage buffers, except those in
    /// [`KernelInfo::texels`].
    pub bindings: u32,
    /// The bindings (a mask) the kernel reads as uniform texel buffers (`samplerBuffer`) rather
    /// than storage buffers, through a view of the whole buffer in [`TexelFormat`]. On llvmpipe
    /// a texel fetch is a vector gather, where a storage-buffer load walks the lanes one by one.
    pub texels: u32,
    /// The texel bindings (a mask within `texels`) viewed as [`TexelFormat::F32x4`]; the
    /// others are [`TexelFormat::F32`] unless in [`KernelInfo::texels_u8`].
    pub texels4: u32,
    /// The texel bindings (a mask within `texels`, apart from `texels4`) viewed as
    /// [`TexelFormat::U8`].
    pub texels_u8: u32,
    /// Size of the push-constant block (0: none).
    pub push_bytes: u32,
    /// The workgroup size compiled into the shader.
    pub local_size: [u32; 3],
    /// The specialisation constant ids that override each dimension (`local_size_x_id` …).
    pub local_size_ids: [Option<u32>; 3],
    /// Shared memory the kernel declares, at the largest workgroup size it allows.
    pub shared_bytes: u32,
    /// Needs the device's `shaderFloat16` (a variant; never the only kernel for a step).
    pub fp16: bool,
    /// Needs subgroup arithmetic in compute shaders (`VK_SUBGROUP_FEATURE_ARITHMETIC_BIT`):
    /// a variant of another kernel ([`Kernel::subgroup_variant`]), never the only one.
    pub subgroups: bool,
    /// Takes its push block's words also as specialisation constants, where constant 1 is
    /// set, to be compiled per shape ([`super::lower::shape_constants`]): every convolution
    /// kernel (`shaders/conv_push.glsl`) and the index-heavy elementwise ones.
    pub shapes: bool,
    /// A tiled GEMM kernel (`shaders/gemm.glsl`) whose tile rows and columns are the
    /// specialisation constants [`GEMM_TILE_IDS`] (default [`GEMM_TILE`]).
    pub tiles: bool,
}

macro_rules! spirv {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shaders/",
            $name,
            ".spv"
        ))
    };
}

/// A table entry; `x` = `Some(id)`: the workgroup's x size is specialisation constant `id`.
macro_rules! kernel {
    ($name:literal, bindings $b:expr, push $p:expr, local $l:expr, x $x:expr, shared $s:expr) => {
        KernelInfo {
            name: $name,
            spirv: spirv!($name),
            bindings: $b,
            push_bytes: $p,
            local_size: $l,
            local_size_ids: [$x, None, None],
            shared_bytes: $s,
            texels: 0,
            texels4: 0,
            texels_u8: 0,
            fp16: false,
            subgroups: false,
            shapes: $p == CONV_PUSH_BYTES,
            tiles: false,
        }
    };
}

/// Push bytes of the convolution kernels (`shaders/conv_push.glsl`).
pub const CONV_PUSH_BYTES: u32 = 72;
/// Pixels of a `pointwise_direct` workgroup (16 lanes × `PX` in its shader; its channels are
/// the tiled kernel's 32).
pub const POINTWISE_DIRECT_PIXELS: u32 = 128;
/// Whether a pointwise conv of `c_in` input channels over `plane` pixels can use the vec4
/// kernels (`*_direct4`): whole vec4s along the pixels and along a weight row.
pub fn pointwise_direct4_fits(c_in: u32, plane: u64) -> bool {
    c_in.is_multiple_of(4) && plane.is_multiple_of(4)
}
/// Whether an add of `len` elements can use the vec4 kernels (`add_direct4`,
/// `add_assign_direct4`): whole vec4s.
pub fn add_direct4_fits(len: u32) -> bool {
    len.is_multiple_of(4)
}
/// Pixels and output channels of a `pointwise_thin` workgroup (its local size).
pub const POINTWISE_THIN_GROUP: [u32; 2] = [64, 4];
/// Push bytes of the loss kernels (`shaders/loss.glsl`).
pub const LOSS_PUSH_BYTES: u32 = 44;
/// The default tile of the implicit-GEMM convolution kernels (`shaders/gemm.glsl`): output
/// rows, output columns and reduction depth per step. The rows and columns are specialisation
/// constants ([`GEMM_TILE_IDS`]), chosen per shape from [`GEMM_TILE_ROWS`] and
/// [`GEMM_TILE_COLS`] ([`super::lower`]'s `gemm_tile`).
pub const GEMM_TILE: [u32; 3] = [32, 64, 16];
/// The specialisation constants that set a tiled GEMM kernel's tile rows and columns
/// (`GEMM_BM`, `GEMM_BN` in `shaders/gemm.glsl`; [`KernelInfo::tiles`]).
pub const GEMM_TILE_IDS: [u32; 2] = [30, 31];
/// The tile rows a tiled GEMM kernel can be specialised to (16 per invocation row).
pub const GEMM_TILE_ROWS: [u32; 3] = [16, 32, 64];
/// The tile columns a tiled GEMM kernel can be specialised to (16 per invocation column;
/// each divides the workgroup's 256 invocations, so an invocation loads one column).
pub const GEMM_TILE_COLS: [u32; 4] = [16, 32, 64, 128];
/// Output channels and weight columns one workgroup of `conv2d_grad_weight_direct` sums
/// (`TM`, `TN` in its shader).
pub const CONV_GRAD_WEIGHT_DIRECT_TILE: [u32; 2] = [16, 9];
/// The same for `conv2d_grad_weight_direct4` (`TM`, `TN` in its shader).
pub const CONV_GRAD_WEIGHT_DIRECT4_TILE: [u32; 2] = [8, 16];
/// Shared memory of the direct weight-gradient kernels: 64 lanes' sums, 48 at a time
/// (`CHUNK` in `shaders/conv2d_grad_weight_direct.glsl`).
const CONV_GRAD_WEIGHT_DIRECT_SHARED: u32 = 4 * 64 * 48;
/// Sums one workgroup of `conv2d_grad_reduce` adds (`BLOCK` in its shader).
pub const CONV_GRAD_REDUCE_BLOCK: u32 = 32;
/// Outputs of a row one invocation of `depthwise_direct` computes, and inputs of a row one of
/// `depthwise_grad_input_direct` does (`OX` in their shaders; the GPU kernels' four).
pub const DEPTHWISE_DIRECT_OUTPUTS: u32 = 8;
/// Rows one invocation of `depthwise_direct` computes those outputs for, and one of
/// `depthwise_grad_input_direct` those inputs (`OY` in their shaders; the GPU kernels' one),
/// sharing the rows they read between them.
pub const DEPTHWISE_DIRECT_ROWS: u32 = 2;
/// Most taps (`k²`) `depthwise_grad_weight_direct` sums (`MAX_TAPS` in its shader).
pub const DEPTHWISE_DIRECT_MAX_TAPS: u32 = 25;
/// Output channels one invocation of the direct `conv2d` kernel computes
/// (`OCB` in `shaders/conv2d.comp`).
pub const CONV_CHANNEL_BLOCK: u32 = 8;
/// Gradients one [`Kernel::SumSquares`] dispatch sums.
pub const SUM_SQUARES_GROUP: usize = 4;
/// Candidate slots of the decode kernel's sort; `top_k` may be at most half of it.
pub const DECODE_SLOTS: u32 = 1024;

const GEMM_LOCAL: [u32; 3] = [16, 16, 1];
/// The two tiles at their largest, plus at most four double-buffered tables of `GEMM_BK`
/// words.
const GEMM_SHARED: u32 =
    4 * GEMM_TILE[2] * (GEMM_TILE_ROWS[2] + GEMM_TILE_COLS[3]) + 4 * 2 * 4 * GEMM_TILE[2];
/// The same with f16 tiles.
const GEMM_SHARED_F16: u32 =
    2 * GEMM_TILE[2] * (GEMM_TILE_ROWS[2] + GEMM_TILE_COLS[3]) + 4 * 2 * 4 * GEMM_TILE[2];
const LINEAR: [u32; 3] = [256, 1, 1];

static SAXPY: KernelInfo =
    kernel!("saxpy", bindings 2, push 8, local [64, 1, 1], x Some(0), shared 0);
static CONV2D: KernelInfo =
    kernel!("conv2d", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x None, shared 0);
static CONV2D_QUAD: KernelInfo =
    kernel!("conv2d_quad", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x None, shared 0);
static CONV2D_RGB: KernelInfo =
    kernel!("conv2d_rgb", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x None, shared 0);
static CONV2D_QUAD_RGB: KernelInfo =
    kernel!("conv2d_quad_rgb", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x None, shared 0);
/// The fp16 variant of kernel `$of` (`shaders/$name.comp`: the same shader with F16 defined,
/// `shaders/f16.glsl`).
macro_rules! fp16_variant {
    ($of:expr, $name:literal) => {
        KernelInfo {
            name: $name,
            spirv: spirv!($name),
            fp16: true,
            ..$of
        }
    };
}
static CONV2D_F16: KernelInfo = fp16_variant!(CONV2D, "conv2d_f16");
static CONV2D_QUAD_F16: KernelInfo = fp16_variant!(CONV2D_QUAD, "conv2d_quad_f16");
static CONV2D_RGB_F16: KernelInfo = fp16_variant!(CONV2D_RGB, "conv2d_rgb_f16");
static CONV2D_QUAD_RGB_F16: KernelInfo = fp16_variant!(CONV2D_QUAD_RGB, "conv2d_quad_rgb_f16");
static CONV2D_DIRECT: KernelInfo = KernelInfo {
    texels: 0b11,
    ..kernel!("conv2d_direct", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x None, shared 0)
};
static CONV2D_DIRECT_RGB: KernelInfo = KernelInfo {
    texels: 0b11,
    texels_u8: 0b1,
    ..kernel!("conv2d_direct_rgb", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x None,
        shared 0)
};
static POINTWISE: KernelInfo = KernelInfo {
    tiles: true,
    ..kernel!("pointwise", bindings 5, push CONV_PUSH_BYTES, local GEMM_LOCAL, x None,
        shared GEMM_SHARED)
};
static POINTWISE_DIRECT: KernelInfo = kernel!("pointwise_direct", bindings 5,
    push CONV_PUSH_BYTES, local [16, 4, 1], x None, shared 0);
static POINTWISE_DIRECT4: KernelInfo = KernelInfo {
    texels: 0b11,
    texels4: 0b11,
    ..kernel!("pointwise_direct4", bindings 5, push CONV_PUSH_BYTES, local [16, 4, 1], x None,
        shared 0)
};
static POINTWISE_THIN: KernelInfo = kernel!("pointwise_thin", bindings 5,
    push CONV_PUSH_BYTES, local [POINTWISE_THIN_GROUP[0], POINTWISE_THIN_GROUP[1], 1], x None,
    shared 0);
static POINTWISE_F16: KernelInfo = KernelInfo {
    shared_bytes: GEMM_SHARED_F16,
    ..fp16_variant!(POINTWISE, "pointwise_f16")
};
static POINTWISE_THIN_F16: KernelInfo = fp16_variant!(POINTWISE_THIN, "pointwise_thin_f16");
static CONV2D_GRAD_INPUT: KernelInfo = KernelInfo {
    tiles: true,
    ..kernel!("conv2d_grad_input", bindings 4, push CONV_PUSH_BYTES, local GEMM_LOCAL, x None,
        shared GEMM_SHARED)
};
static CONV2D_GRAD_INPUT_DIRECT: KernelInfo = KernelInfo {
    texels: 0b111,
    ..kernel!("conv2d_grad_input_direct", bindings 4, push CONV_PUSH_BYTES, local [16, 4, 1],
        x None, shared 0)
};
static CONV2D_GRAD_INPUT_DIRECT4: KernelInfo = KernelInfo {
    texels: 0b111,
    texels4: 0b111,
    ..kernel!("conv2d_grad_input_direct4", bindings 4, push CONV_PUSH_BYTES, local [16, 2, 1],
        x None, shared 0)
};
static CONV2D_GRAD_WEIGHT: KernelInfo = KernelInfo {
    tiles: true,
    ..kernel!("conv2d_grad_weight", bindings 6, push CONV_PUSH_BYTES, local GEMM_LOCAL, x None,
        shared GEMM_SHARED)
};
static CONV2D_GRAD_WEIGHT_DIRECT: KernelInfo = KernelInfo {
    texels: 0b111,
    ..kernel!("conv2d_grad_weight_direct", bindings 6, push CONV_PUSH_BYTES, local [64, 1, 1],
        x None,
        shared CONV_GRAD_WEIGHT_DIRECT_SHARED)
};
static CONV2D_GRAD_WEIGHT_DIRECT4: KernelInfo = KernelInfo {
    texels: 0b111,
    texels4: 0b111,
    ..kernel!("conv2d_grad_weight_direct4", bindings 6, push CONV_PUSH_BYTES, local [64, 1, 1],
        x None,
        shared CONV_GRAD_WEIGHT_DIRECT_SHARED)
};
static CONV2D_GRAD_REDUCE: KernelInfo = kernel!("conv2d_grad_reduce", bindings 3,
    push CONV_PUSH_BYTES, local [CONV_GRAD_REDUCE_BLOCK, 8, 1], x None,
    shared 4 * 8 * CONV_GRAD_REDUCE_BLOCK);
static CONV2D_GRAD_REDUCE_DIRECT: KernelInfo = KernelInfo {
    texels: 0b1,
    ..kernel!("conv2d_grad_reduce_direct", bindings 3, push CONV_PUSH_BYTES, local LINEAR,
        x Some(0), shared 0)
};
static DEPTHWISE: KernelInfo =
    kernel!("depthwise", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x Some(0), shared 0);
static DEPTHWISE_F16: KernelInfo = fp16_variant!(DEPTHWISE, "depthwise_f16");
static DEPTHWISE_DIRECT: KernelInfo = KernelInfo {
    texels: 0b111,
    ..kernel!("depthwise_direct", bindings 4, push CONV_PUSH_BYTES, local LINEAR, x Some(0),
        shared 0)
};
static DEPTHWISE_GRAD_INPUT: KernelInfo = kernel!("depthwise_grad_input", bindings 4,
    push CONV_PUSH_BYTES, local LINEAR, x Some(0), shared 0);
static DEPTHWISE_GRAD_INPUT_DIRECT: KernelInfo = KernelInfo {
    texels: 0b111,
    ..kernel!("depthwise_grad_input_direct", bindings 4, push CONV_PUSH_BYTES, local LINEAR,
        x Some(0), shared 0)
};
static DEPTHWISE_GRAD_WEIGHT: KernelInfo = kernel!("depthwise_grad_weight", bindings 6,
    push CONV_PUSH_BYTES, local LINEAR, x None, shared 4 * 256);
static CONV_GRAD_BIAS: KernelInfo = kernel!("conv_grad_bias", bindings 3,
    push CONV_PUSH_BYTES, local LINEAR, x None, shared 4 * 256);
static DEPTHWISE_GRAD_WEIGHT_SUBGROUP: KernelInfo = KernelInfo {
    subgroups: true,
    ..kernel!("depthwise_grad_weight_subgroup", bindings 6, push CONV_PUSH_BYTES, local LINEAR,
        x None, shared 4 * 256)
};
static DEPTHWISE_GRAD_WEIGHT_DIRECT: KernelInfo = KernelInfo {
    texels: 0b111,
    ..kernel!("depthwise_grad_weight_direct", bindings 6, push CONV_PUSH_BYTES,
        local [64, 1, 1], x None, shared 4 * 64 * (DEPTHWISE_DIRECT_MAX_TAPS + 1))
};
static ADD: KernelInfo = kernel!("add", bindings 3, push 4, local LINEAR, x Some(0), shared 0);
static ADD_ASSIGN: KernelInfo =
    kernel!("add_assign", bindings 2, push 4, local LINEAR, x Some(0), shared 0);
static ADD_DIRECT4: KernelInfo = KernelInfo {
    texels: 0b11,
    texels4: 0b11,
    ..kernel!("add_direct4", bindings 3, push 4, local LINEAR, x Some(0), shared 0)
};
static ADD_ASSIGN_DIRECT4: KernelInfo = KernelInfo {
    texels: 0b110,
    texels4: 0b110,
    ..kernel!("add_assign_direct4", bindings 3, push 4, local LINEAR, x Some(0), shared 0)
};
static MASKED_ADD_ASSIGN: KernelInfo =
    kernel!("masked_add_assign", bindings 3, push 4, local LINEAR, x Some(0), shared 0);
static MASKED_ADD_ASSIGN_DIRECT4: KernelInfo = KernelInfo {
    texels: 0b1110,
    texels4: 0b1110,
    ..kernel!("masked_add_assign_direct4", bindings 4, push 4, local LINEAR, x Some(0), shared 0)
};
static UPSAMPLE: KernelInfo = KernelInfo {
    shapes: true,
    ..kernel!("upsample", bindings 3, push 20, local LINEAR, x Some(0), shared 0)
};
static UPSAMPLE_GRAD: KernelInfo = KernelInfo {
    shapes: true,
    ..kernel!("upsample_grad", bindings 2, push 16, local LINEAR, x Some(0), shared 0)
};
static NORMALIZE: KernelInfo = KernelInfo {
    shapes: true,
    ..kernel!("normalize", bindings 2, push 20, local LINEAR, x Some(0), shared 0)
};
static TARGETS: KernelInfo =
    kernel!("targets", bindings 2, push 64, local LINEAR, x Some(0), shared 0);
static ROW_COPY: KernelInfo =
    kernel!("row_copy", bindings 2, push 24, local LINEAR, x Some(0), shared 0);
/// The first loss pass's workgroup sums: a vec4 and a float an invocation
/// (`shaders/workgroup_sum.glsl`).
const LOSS_SHARED: u32 = (16 + 4) * 256;
static LOSS_PARTIAL: KernelInfo = kernel!("loss_partial", bindings 4, push LOSS_PUSH_BYTES,
    local LINEAR, x None, shared LOSS_SHARED);
static LOSS_PARTIAL_SUBGROUP: KernelInfo = KernelInfo {
    subgroups: true,
    ..kernel!("loss_partial_subgroup", bindings 4, push LOSS_PUSH_BYTES, local LINEAR, x None,
        shared LOSS_SHARED)
};
static LOSS_FINISH: KernelInfo = kernel!("loss_finish", bindings 2, push LOSS_PUSH_BYTES,
    local [1, 1, 1], x None, shared 0);
static LOSS_GRAD: KernelInfo =
    kernel!("loss_grad", bindings 4, push LOSS_PUSH_BYTES, local LINEAR, x Some(0), shared 0);
static LOSS_GRAD_FINISH: KernelInfo = KernelInfo {
    texels: 0b100,
    texels4: 0b100,
    ..kernel!("loss_grad_finish", bindings 5, push LOSS_PUSH_BYTES, local LINEAR, x None,
        shared 0)
};
static SUM_SQUARES: KernelInfo =
    kernel!("sum_squares", bindings 5, push 20, local LINEAR, x None, shared 4 * 256);
static SUM_SQUARES_SUBGROUP: KernelInfo = KernelInfo {
    subgroups: true,
    ..kernel!("sum_squares_subgroup", bindings 5, push 20, local LINEAR, x None, shared 4 * 256)
};
static CLIP_GRAD: KernelInfo =
    kernel!("clip_grad", bindings 2, push 8, local LINEAR, x None, shared 4 * 256);
static ADAMW: KernelInfo = kernel!("adamw", bindings 5, push 20, local LINEAR, x Some(0), shared 0);
static SGD: KernelInfo = kernel!("sgd", bindings 4, push 12, local LINEAR, x Some(0), shared 0);
static EMA: KernelInfo = kernel!("ema", bindings 3, push 4, local LINEAR, x Some(0), shared 0);
static ADAMW_EMA: KernelInfo =
    kernel!("adamw_ema", bindings 6, push 20, local LINEAR, x Some(0), shared 0);
static DECODE: KernelInfo =
    kernel!("decode", bindings 3, push 40, local LINEAR, x None, shared 8 * DECODE_SLOTS + 4);

/// Push bytes of [`Kernel::FramePass`]: eleven words of layout and six of colour matrix.
pub const FRAME_PUSH_BYTES: u32 = 68;
static FRAME_PASS: KernelInfo = kernel!("frame_pass", bindings 3, push FRAME_PUSH_BYTES,
    local [16, 4, 1], x None, shared 0);

impl Kernel {
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The kernel that does this one's work with its workgroup's sums by subgroup operations
    /// (the same bindings, push block, grid and results up to summation order), if it has
    /// one.
    pub fn subgroup_variant(self) -> Option<Kernel> {
        match self {
            Kernel::DepthwiseGradWeight => Some(Kernel::DepthwiseGradWeightSubgroup),
            Kernel::LossPartial => Some(Kernel::LossPartialSubgroup),
            Kernel::SumSquares => Some(Kernel::SumSquaresSubgroup),
            _ => None,
        }
    }

    /// The kernel that does this one's work with f16 operands and products and f32 sums (the
    /// same bindings, push block, grid, and results up to f16 rounding), if it has one.
    pub fn fp16_variant(self) -> Option<Kernel> {
        match self {
            Kernel::Conv2d => Some(Kernel::Conv2dF16),
            Kernel::Conv2dQuad => Some(Kernel::Conv2dQuadF16),
            Kernel::Conv2dRgb => Some(Kernel::Conv2dRgbF16),
            Kernel::Conv2dQuadRgb => Some(Kernel::Conv2dQuadRgbF16),
            Kernel::Pointwise => Some(Kernel::PointwiseF16),
            Kernel::PointwiseThin => Some(Kernel::PointwiseThinF16),
            Kernel::Depthwise => Some(Kernel::DepthwiseF16),
            _ => None,
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A 64-bit FNV-1a hash of every embedded kernel (name, length and SPIR-V, in table order).
/// The pipeline cache file records it: a cache written for other shaders is not loaded.
pub fn shader_hash() -> u64 {
    static HASH: OnceLock<u64> = OnceLock::new();
    *HASH.get_or_init(|| {
        let mut h = Fnv::new();
        for k in Kernel::ALL {
            let info = k.info();
            h.write(info.name.as_bytes());
            h.write(&(info.spirv.len() as u64).to_le_bytes());
            h.write(info.spirv);
        }
        h.0
    })
}

/// FNV-1a, 64 bits: stable across builds and platforms (unlike `std`'s hasher).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_valid_spirv_within_the_weakest_target() {
        for k in Kernel::ALL {
            let info = k.info();
            assert_eq!(info.spirv.len() % 4, 0, "{k}: SPIR-V is whole words");
            assert_eq!(
                &info.spirv[..4],
                &0x0723_0203u32.to_le_bytes(),
                "{k}: SPIR-V magic"
            );
            let invocations: u32 = info.local_size.iter().product();
            assert!(
                invocations <= MAX_INVOCATIONS,
                "{k}: {invocations} invocations"
            );
            assert!(info.shared_bytes <= MAX_SHARED_BYTES, "{k}: shared memory");
            assert!(
                info.push_bytes % 4 == 0 && info.push_bytes <= 128,
                "{k}: push constants"
            );
            assert!(info.bindings >= 1, "{k}: bindings");
        }
    }

    /// The table's texel bindings are the shader's `samplerBuffer`s, never written, its vec4
    /// views are among them, and its byte views are the shader's integer ones.
    #[test]
    fn texel_bindings_agree_with_the_shaders() {
        for k in Kernel::ALL {
            let info = k.info();
            let shader = super::super::barriers::reflect_bindings(info.spirv).unwrap();
            assert_eq!(shader.texels, info.texels, "{k}: texel bindings");
            assert_eq!(
                shader.writable & info.texels,
                0,
                "{k}: a texel binding is written"
            );
            assert_eq!(
                info.texels4 & !info.texels,
                0,
                "{k}: vec4 view of a storage binding"
            );
            assert_eq!(
                info.texels_u8 & !(info.texels & !info.texels4),
                0,
                "{k}: byte view of a storage or vec4 binding"
            );
            assert_eq!(
                shader.int_texels, info.texels_u8,
                "{k}: integer texels (`usamplerBuffer`) viewed as anything but bytes"
            );
            assert!(
                info.texels < 1 << info.bindings,
                "{k}: texel binding out of range"
            );
        }
        assert_eq!(Kernel::PointwiseDirect4.info().texels, 0b11);
        assert_eq!(Kernel::Conv2dDirectRgb.info().texels_u8, 0b1);
    }

    /// The specialisation constant ids `spirv` declares (`OpDecorate … SpecId`).
    fn spec_ids(spirv: &[u8]) -> Vec<u32> {
        const OP_DECORATE: u32 = 71;
        const DECORATION_SPEC_ID: u32 = 1;
        let words: Vec<u32> = spirv
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (mut ids, mut at) = (Vec::new(), 5);
        while at < words.len() {
            let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
            let w = &words[at..at + count.max(1)];
            if op == OP_DECORATE && count == 4 && w[2] == DECORATION_SPEC_ID {
                ids.push(w[3]);
            }
            at += count.max(1);
        }
        ids
    }

    /// Every kernel the table compiles per shape ([`KernelInfo::shapes`]: the convolutions,
    /// `shaders/conv_push.glsl`, and a few others) declares the switch
    /// ([`super::super::lower::shape_constants`]) and the constants of the push words it
    /// reads (the compiler drops the others); no other kernel declares any of them.
    #[test]
    fn kernels_compiled_per_shape_declare_their_push_words_as_constants() {
        use super::super::lower::SHAPE_SPECIALISED_ID;
        let mut convs = 0;
        for k in Kernel::ALL {
            let info = k.info();
            let ids = spec_ids(info.spirv);
            let shape_ids: Vec<u32> =
                (SHAPE_SPECIALISED_ID..=SHAPE_SPECIALISED_ID + info.push_bytes / 4).collect();
            if info.push_bytes == CONV_PUSH_BYTES {
                assert!(info.shapes, "{k}");
                convs += 1;
            }
            let tile_ids = GEMM_TILE_IDS.iter().filter(|id| ids.contains(id)).count();
            assert_eq!(tile_ids, if info.tiles { 2 } else { 0 }, "{k}: {ids:?}");
            if info.shapes {
                assert!(ids.contains(&SHAPE_SPECIALISED_ID), "{k}: {ids:?}");
                // Some shape word, at least, is in every such kernel's index arithmetic.
                assert!(ids.len() > 2, "{k}: {ids:?}");
                assert!(
                    ids.iter()
                        .all(|id| *id == 0 || shape_ids.contains(id) || GEMM_TILE_IDS.contains(id)),
                    "{k}: {ids:?}"
                );
            } else {
                assert!(!ids.iter().any(|id| shape_ids.contains(id)), "{k}: {ids:?}");
            }
        }
        assert_eq!(convs, 33);
        assert!(Kernel::Normalize.info().shapes && Kernel::Upsample.info().shapes);
        assert_eq!(spec_ids(Kernel::Saxpy.info().spirv), [0]);
    }

    /// A variant (`variant_of`) is its kernel's twin in everything the pipeline and the
    /// lowering see but its shared memory (at most the kernel's), and needs the feature
    /// (`needs`) where its kernel does not; every kernel named with `suffix` is one.
    fn variants_are_twins(
        variant_of: fn(Kernel) -> Option<Kernel>,
        needs: fn(&KernelInfo) -> bool,
        suffix: &str,
    ) -> usize {
        let mut variants = 0;
        for k in Kernel::ALL {
            let info = k.info();
            assert_eq!(needs(info), info.name.ends_with(suffix), "{k}");
            let Some(v) = variant_of(k) else {
                continue;
            };
            variants += 1;
            let vi = v.info();
            assert!(!needs(info) && needs(vi), "{k} → {v}");
            assert_eq!(vi.name, format!("{}{suffix}", info.name));
            assert_eq!(
                (
                    vi.bindings,
                    vi.texels,
                    vi.push_bytes,
                    vi.local_size,
                    vi.local_size_ids,
                    vi.shapes,
                    vi.tiles
                ),
                (
                    info.bindings,
                    info.texels,
                    info.push_bytes,
                    info.local_size,
                    info.local_size_ids,
                    info.shapes,
                    info.tiles
                ),
                "{k} → {v}"
            );
            assert!(vi.shared_bytes <= info.shared_bytes, "{k} → {v}");
        }
        let named = Kernel::ALL.iter().filter(|k| needs(k.info())).count();
        assert_eq!(variants, named);
        variants
    }

    #[test]
    fn subgroup_variants_are_twins_of_their_kernels() {
        assert_eq!(
            variants_are_twins(Kernel::subgroup_variant, |i| i.subgroups, "_subgroup"),
            3
        );
    }

    #[test]
    fn fp16_variants_are_twins_of_their_kernels() {
        assert_eq!(
            variants_are_twins(Kernel::fp16_variant, |i| i.fp16, "_f16"),
            7
        );
    }

    #[test]
    fn table_is_in_variant_order_and_names_are_unique() {
        let mut names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Kernel::ALL.len());
    }

    #[test]
    fn every_shader_file_is_in_the_table() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".comp").map(str::to_owned)
            })
            .collect();
        files.sort();
        let mut table: Vec<String> = Kernel::ALL.iter().map(|k| k.name().to_owned()).collect();
        table.sort();
        assert_eq!(files, table, "shaders/*.comp and Kernel::ALL");
    }

    #[test]
    fn fnv_is_the_reference_fnv1a() {
        let mut h = Fnv::new();
        h.write(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shader_hash(), shader_hash());
    }
}
