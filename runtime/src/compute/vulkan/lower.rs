//! Lowering: a [`Recording`] entry's [`Step`]s become GPU dispatches — the kernel, its
//! workgroup counts, the buffers it binds (the recording's tensors, or one of two scratch
//! buffers) and its push constants. Every integer field of an op goes into push constants, so
//! pipelines depend only on the kernel and are shared by every layer.
//!
//! This is plain data, device-independent and testable without a GPU; [`super::exec`] turns
//! it into buffers, pipelines and recorded command buffers. Each step's own dispatches come
//! from its op's module (`compute::steps`, `StepOp::lower`); this module walks an entry,
//! joins neighbouring steps where one dispatch does both (the rows with a "+" in the table
//! below) and picks the kernel variants, with the helpers the ops' lowerings share.
//!
//! Steps and their dispatches:
//!
//! | step | dispatches |
//! |---|---|
//! | conv forward | `conv2d` (dense, grouped: direct; `conv2d_quad` from `QUAD_MIN_PIXELS` pixels on, `conv2d_direct` on CPU-type devices), `pointwise` (tiled GEMM; `pointwise_thin` where its grid is at most [`THIN_MAX_TILES`] tiles) or `depthwise` (direct) |
//! | pointwise conv or upsampling forward + the residual add after it | `pointwise*` or `upsample` with the add in its store, where [`crate::compute::fusion`] allows |
//! | normalize + the stem that reads it | `conv2d_rgb`, `conv2d_quad_rgb` or `conv2d_direct_rgb` reading the records, where [`crate::compute::fusion`] allows |
//! | conv backward | `*_grad_input` (unless `gx` is left out), `*_grad_weight` (gw and gb), and `conv2d_grad_reduce` when the weight gradient is split over the batch; `conv_grad_bias` alone in place of the last two for a frozen weight (`gw` left out) |
//! | add, add-assign, upsample (fwd/bwd), normalize, targets | one each (the adds over whole vec4s in `*_direct4` on CPU-type devices) |
//! | loss forward | `loss_partial`, plus `loss_finish` when the cells are split into parts |
//! | loss forward + its backward right after it (training) | `loss_partial`, then `loss_grad_finish` (the parts added in the gradient's pass) where the cells are split into parts |
//! | loss backward, AdamW, EMA, SGD, decode, clip | one each |
//! | sums of squares (gradient clipping) | `sum_squares`, one for up to four consecutive |
//!
//! Where the device's subgroups have arithmetic ([`Variants::subgroups`]), a kernel with a
//! `_subgroup` variant ([`Kernel::subgroup_variant`]) runs as the variant.
//!
//! Splitting: a weight gradient sums over every image and output pixel. For the early layers
//! of a large batch that is a long sum onto few outputs, so it is cut into `splits` parts
//! (a workgroup each) written to the conv scratch buffer and added in a fixed order by a
//! second dispatch: deterministic, no float atomics. The loss is reduced the same way.

use super::kernels::{
    add_direct4_fits, Kernel, CONV_PUSH_BYTES, GEMM_TILE, GEMM_TILE_COLS, GEMM_TILE_IDS,
    GEMM_TILE_ROWS, LOSS_PUSH_BYTES, SUM_SQUARES_GROUP,
};
use super::pipeline::SpecConstant;
use crate::compute::fusion::{self, GradStore, ResidualAdd};
use crate::compute::ops::{AdamW, CenterLoss, Conv2d, ConvKind, Normalize, SumSquares};
use crate::compute::recording::{Recording, RecordingError, Step, TensorId};

/// Invocations of the one-dimensional kernels' workgroups (their default workgroup size).
pub const LINEAR_WORKGROUP: u32 = 256;
/// Tiles of a pointwise conv's GEMM grid up to which a GPU runs it with one output per
/// invocation instead (`pointwise_thin`): a grid that small leaves most of a GPU idle while
/// each tile walks its sum in 16-deep steps with two barriers each. det-s's batch-1 forward
/// pass has 2–16 tiles per layer, its training step at batch 32 at least 64.
pub const THIN_MAX_TILES: u64 = 32;
/// Workgroup count every Vulkan device supports in each dimension.
pub const MAX_GROUPS: u32 = 65_535;

/// Terms of a split weight-gradient sum below which it is not split further: 8 GEMM steps.
/// A part is a serial chain of steps (each with two barriers) in one workgroup, so long
/// parts leave a GPU idle. det-s's training step at batch 32 on an NVIDIA H200: 4.12 ms
/// with parts of at least 2048 terms (the weight gradients 3.06 ms of it), 1.50 ms at 512,
/// 1.14 ms at 256, 0.98 ms at 128 (with up to 512 parts; lavapipe unchanged).
const MIN_SPLIT_TERMS: u64 = 128;
/// Most parts a weight gradient or the loss is split into.
const MAX_SPLITS: u64 = 512;
/// Workgroups a split weight gradient aims to keep busy. The partial sums take at most
/// about this many GEMM tiles (32 × 64 floats each, 4 MiB in all) of conv scratch.
const TARGET_GROUPS: u64 = 512;
/// The direct weight gradient's parts ([`Kernel::Conv2dGradWeightDirect`], CPU-type devices):
/// at least 32 terms for each of a workgroup's 64 invocations, and about as many workgroups as
/// a CPU has cores to spread them over, several times over.
pub(crate) const DIRECT_SPLIT: SplitRule = SplitRule {
    min_terms: 64 * 32,
    target_groups: 64,
    align: 64,
};
/// The tiled weight gradient's parts (see [`MIN_SPLIT_TERMS`], [`TARGET_GROUPS`]).
pub(crate) const TILED_SPLIT: SplitRule = SplitRule {
    min_terms: MIN_SPLIT_TERMS,
    target_groups: TARGET_GROUPS,
    align: GEMM_TILE[2] as u64,
};

/// How a weight-gradient sum is cut into parts, a workgroup each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SplitRule {
    /// Terms below which a part is not split further.
    min_terms: u64,
    /// Workgroups the parts and output tiles together aim for.
    target_groups: u64,
    /// Parts are whole multiples of this many terms.
    align: u64,
}

/// Output pixels (over the batch) from which a dense conv takes four of a row per invocation
/// on every device (`conv2d_quad`). det-s's stem on an NVIDIA H200: at batch 1 (4096 pixels)
/// 0.011 ms with one pixel an invocation, 0.017 ms with four; at batch 32 (131 072) 0.053 ms
/// a dispatch with one, 0.051 with four (and 0.065 with the one-pixel build of conv2d.glsl).
pub(crate) const QUAD_MIN_PIXELS: u64 = 1 << 16;
/// Grid cells one loss workgroup sums.
const LOSS_CELLS_PER_PART: u64 = 2048;

/// A buffer a dispatch binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// A tensor of the recording.
    Tensor(TensorId),
    /// Partial weight gradients of split conv backward passes
    /// ([`Lowered::conv_partial_floats`]).
    ConvPartial,
    /// Partial sums of the loss ([`Lowered::loss_partial_floats`]).
    LossPartial,
}

/// One dispatch, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoweredDispatch {
    pub kernel: Kernel,
    /// Binding `i` is `bindings[i]`.
    pub bindings: Vec<Slot>,
    pub push: Vec<u8>,
    pub groups: [u32; 3],
    /// Index of the step (in its entry) this dispatch belongs to.
    pub step: usize,
    /// The specialisation constants of its pipeline ([`shape_constants`] where
    /// [`Variants::shapes`], and a tiled GEMM's tile where it is not the default
    /// [`GEMM_TILE`]): dispatches of one kernel share a pipeline where these are equal.
    pub spec: Vec<SpecConstant>,
}

/// A whole recording, lowered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lowered {
    /// Dispatches of each entry, in the recording's entry order.
    pub entries: Vec<Vec<LoweredDispatch>>,
    /// Floats the conv scratch buffer must hold (0: nothing is split).
    pub conv_partial_floats: usize,
    /// Floats the loss scratch buffer must hold (0: no loss is split).
    pub loss_partial_floats: usize,
}

/// Which kernel variants a lowering picks where a step has more than one (the engine's
/// choice for its device: [`super::Engine::variants`]). Variants change no buffer and no
/// grid, only the kernel a dispatch runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Variants {
    /// The fp16 variants of the forward convolutions ([`Kernel::fp16_variant`]: f16 operands
    /// and products, f32 sums): the stem, depthwise and pointwise kernels, so a forward pass
    /// multiplies in f16 throughout. Those steps then take the GPUs' kernels, which have the
    /// variants, where `direct` is also set; every other step keeps its f32 kernel.
    pub fp16: bool,
    /// The direct variants, without shared memory or barriers (for CPU-type devices).
    pub direct: bool,
    /// The subgroup variants ([`Kernel::subgroup_variant`]): a workgroup's sums by subgroup
    /// operations, for devices whose subgroups have arithmetic in compute shaders.
    pub subgroups: bool,
    /// The kernels that allow it (every convolution, and the few others whose table entry
    /// says so) compiled per shape: each dispatch's push block also as specialisation
    /// constants ([`shape_constants`]), which the compiler folds into the code.
    pub shapes: bool,
    /// The tile every tiled GEMM dispatch takes (rows from [`GEMM_TILE_ROWS`], columns from
    /// [`GEMM_TILE_COLS`]), for tests and A/B runs; `None`: each its own, chosen for its shape.
    pub gemm_tile: Option<[u32; 2]>,
}

/// Why a recording could not be lowered.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    /// The recording does not validate.
    #[error("{0}")]
    Recording(RecordingError),
    /// A step has no dispatch on every device.
    #[error("entry {entry:?}, step {step} ({kind}): {problem}")]
    Step {
        entry: String,
        step: usize,
        /// What the step is (`Step::name`).
        kind: &'static str,
        problem: StepError,
    },
}

/// Why one step has no dispatch.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("{what}: workgroup grid {groups:?} is outside 1..={MAX_GROUPS} per dimension")]
    Grid {
        what: &'static str,
        groups: [u64; 3],
    },
    #[error("decode top_k {top_k} is more than the {kept} the GPU decode keeps per image")]
    DecodeTopK { top_k: u32, kept: u32 },
}

/// Lowers every entry of `recording` (which must validate) to the f32 tiled kernels.
pub fn lower(recording: &Recording) -> Result<Lowered, LowerError> {
    lower_with(recording, Variants::default())
}

/// As [`lower`], with the kernel `variants` where steps have them (fp16 wins over direct).
pub fn lower_with(recording: &Recording, variants: Variants) -> Result<Lowered, LowerError> {
    recording.validate().map_err(LowerError::Recording)?;
    let mut lowered = Lowered {
        entries: Vec::with_capacity(recording.entries.len()),
        conv_partial_floats: 0,
        loss_partial_floats: 0,
    };
    for (e, entry) in recording.entries.iter().enumerate() {
        let adds = fusion::residual_adds(recording, e);
        let stems = normalized_stems(recording, e);
        let (masked_stores, gy_masked) = gradient_masks(recording, e);
        let mut dispatches = Vec::new();
        let step_error = |step: usize, kind: &'static str| {
            move |problem| LowerError::Step {
                entry: entry.name.clone(),
                step,
                kind,
                problem,
            }
        };
        let mut steps = entry.steps.iter().enumerate().peekable();
        while let Some((i, step)) = steps.next() {
            if let Step::SumSquares { op, x, sums } = *step {
                // Up to four consecutive gradients' sums in one dispatch.
                let mut group = vec![(x, op)];
                while group.len() < SUM_SQUARES_GROUP {
                    match steps.peek() {
                        Some((
                            _,
                            Step::SumSquares {
                                op: next,
                                x,
                                sums: s,
                            },
                        )) if *s == sums && next.slot == op.slot + group.len() as u32 => {
                            group.push((*x, *next));
                            steps.next();
                        }
                        _ => break,
                    }
                }
                if group.len() == 1 {
                    lower_step(step, i, None, variants, &mut lowered, &mut dispatches)
                        .map_err(step_error(i, step.name()))?;
                } else {
                    dispatches.push(sum_squares(&group, sums, i));
                }
                continue;
            }
            if let Some(fused) = steps.peek().and_then(|(_, next)| adamw_ema(step, next, i)) {
                dispatches.push(fused);
                steps.next();
                continue;
            }
            if let Some((j, next)) = steps.peek().copied() {
                if loss_with_gradient(step, next, i, j, &mut lowered, &mut dispatches) {
                    steps.next();
                    continue;
                }
            }
            if let (true, Step::Normalize { op, records, .. }) = (stems[i], step) {
                // The stem after it reads the records.
                let (j, stem) = steps.next().expect("a stem follows");
                let at = dispatches.len();
                lower_step(stem, j, None, variants, &mut lowered, &mut dispatches)
                    .map_err(step_error(j, "stem"))?;
                reading_records(&mut dispatches[at], *records, op);
                continue;
            }
            if adds[i].is_some() {
                // The add after this step is done in its store.
                steps.next();
            }
            let at = dispatches.len();
            lower_step(step, i, adds[i], variants, &mut lowered, &mut dispatches)
                .map_err(step_error(i, step.name()))?;
            if gy_masked[i] {
                // Its output gradient is masked already: no ReLU mask in its kernels.
                for d in &mut dispatches[at..] {
                    d.push[4 * CONV_RELU_WORD..][..4].copy_from_slice(&0u32.to_le_bytes());
                }
            }
            if let (
                Some(store),
                &Step::ConvBackward {
                    x, gx: Some(gx), ..
                },
            ) = (masked_stores[i], step)
            {
                // The add after it, with the mask, in its place.
                let add = store.add.expect("gradient_masks: with an add");
                let len = recording.get(gx).len as u32;
                let (j, _) = steps.next().expect("the add after it");
                dispatches.push(masked_add_assign(gx, add, x, len, j, variants));
            }
        }
        if variants.subgroups {
            for d in &mut dispatches {
                d.kernel = d.kernel.subgroup_variant().unwrap_or(d.kernel);
            }
        }
        if variants.fp16 {
            // After the stem's dispatch reads the records (its `_rgb` kernel has a variant).
            for d in &mut dispatches {
                d.kernel = d.kernel.fp16_variant().unwrap_or(d.kernel);
            }
        }
        if variants.shapes {
            // After every push block is final (a stem's is patched to read the records).
            for d in &mut dispatches {
                if d.kernel.info().shapes {
                    d.spec.splice(0..0, shape_constants(&d.push));
                }
            }
        }
        lowered.entries.push(dispatches);
    }
    Ok(lowered)
}

/// The input gradients this engine masks for the ReLU layer before ([`fusion::grad_stores`]):
/// those with a residual's add after them, in the add's own pass (`masked_add_assign`), for
/// each step; and the backward steps that then take their output gradient as masked. A mask
/// alone would be a pass of its own, which cost more on lavapipe than the kernels that then
/// skip it saved (det-s at batch 32: 13 such passes took 13–15 % of the forward convolutions'
/// time, where the three that ride on an add took 4–5 % with the adds).
pub(crate) fn gradient_masks(
    recording: &Recording,
    entry: usize,
) -> (Vec<Option<GradStore>>, Vec<bool>) {
    let grads = fusion::grad_stores(recording, entry);
    let masks = |s: &GradStore| s.relu_of_input && s.add.is_some();
    let stores: Vec<Option<GradStore>> = grads.store.iter().map(|s| s.filter(masks)).collect();
    let gy_masked = grads
        .gy_masked
        .iter()
        .map(|by| by.is_some_and(|p| stores[p].is_some()))
        .collect();
    (stores, gy_masked)
}

/// For each step of entry `entry`: whether its dispatch also does the next step (a residual
/// add in the store of a pointwise conv or an upsampling, where [`fusion::residual_adds`]
/// allows it; a normalisation in the stem, where [`normalized_stems`] does), what
/// [`crate::compute::storage::StoragePlan::shared`] must keep apart.
pub(crate) fn joined_steps(recording: &Recording, entry: usize) -> Vec<bool> {
    let stems = normalized_stems(recording, entry);
    fusion::residual_adds(recording, entry)
        .iter()
        .zip(stems)
        .map(|(add, stem)| add.is_some() || stem)
        .collect()
}

/// For each step of entry `entry`: whether it is a [`Step::Normalize`] whose output only the
/// next step reads ([`fusion::normalized_convs`]), a dense conv of the normalised images with
/// one group: the stem, which `conv2d_rgb` runs from the records.
pub(crate) fn normalized_stems(recording: &Recording, entry: usize) -> Vec<bool> {
    fusion::normalized_convs(recording, entry, |norm, op| {
        op.kind() == ConvKind::Dense && (op.n, op.c_in, op.h, op.w) == (norm.n, 3, norm.h, norm.w)
    })
}

/// Makes the stem's dispatch `d` (a `conv2d`, `conv2d_quad` or `conv2d_direct`) read
/// `records` as `norm` would normalise them.
fn reading_records(d: &mut LoweredDispatch, records: TensorId, norm: &Normalize) {
    d.kernel = match d.kernel {
        Kernel::Conv2d => Kernel::Conv2dRgb,
        Kernel::Conv2dQuad => Kernel::Conv2dQuadRgb,
        Kernel::Conv2dDirect => Kernel::Conv2dDirectRgb,
        other => unreachable!("a dense conv lowers to conv2d, _quad or _direct, not {other}"),
    };
    d.bindings[0] = Slot::Tensor(records);
    for (word, value) in [
        (CONV_RECORD_STRIDE_WORD, norm.record_stride),
        (CONV_RECORD_STRIDE_WORD + 1, u32::from(norm.flip)),
    ] {
        d.push[4 * word..][..4].copy_from_slice(&value.to_le_bytes());
    }
}

/// The loss's first pass (`loss_partial`, attributed to step `i`) over `op`'s grid cells in
/// parts, sizing the loss scratch in `lowered` for more than one; also the parts and the
/// loss kernels' push block.
pub(crate) fn loss_partial(
    op: &CenterLoss,
    [pred, target, loss]: [TensorId; 3],
    i: usize,
    lowered: &mut Lowered,
) -> (LoweredDispatch, u32, Vec<u8>) {
    let cells = u64::from(op.n) * u64::from(op.grid_h) * u64::from(op.grid_w);
    let parts = cells.div_ceil(LOSS_CELLS_PER_PART).clamp(1, MAX_SPLITS);
    let per = cells.div_ceil(parts);
    let parts = cells.div_ceil(per) as u32;
    let push = loss_push(op, parts, per as u32);
    if parts > 1 {
        lowered.loss_partial_floats = lowered.loss_partial_floats.max(8 * parts as usize);
    }
    let dispatch = LoweredDispatch {
        kernel: Kernel::LossPartial,
        bindings: vec![
            Slot::Tensor(pred),
            Slot::Tensor(target),
            Slot::LossPartial,
            Slot::Tensor(loss),
        ],
        push: push.clone(),
        groups: [parts, 1, 1],
        step: i,
        spec: Vec::new(),
    };
    (dispatch, parts, push)
}

/// Lowers a loss (step `i`) and its gradient right after it (step `j`), as a training step
/// records them, into `out`: with the loss in parts, the parts' sums are added in the
/// gradient's pass (`loss_grad_finish`), one pass fewer than `loss_finish` then `loss_grad`.
/// False (nothing lowered) for any other pair, or a loss in one part (whose first pass writes
/// the loss itself).
fn loss_with_gradient(
    step: &Step,
    next: &Step,
    i: usize,
    j: usize,
    lowered: &mut Lowered,
    out: &mut Vec<LoweredDispatch>,
) -> bool {
    let (
        &Step::LossForward {
            op,
            pred,
            target,
            loss,
        },
        &Step::LossBackward {
            op: grad_op,
            pred: grad_pred,
            target: grad_target,
            loss: grad_loss,
            grad,
        },
    ) = (step, next)
    else {
        return false;
    };
    let same = (grad_op, grad_pred, grad_target, grad_loss) == (op, pred, target, loss);
    if !same || [pred, target, loss].contains(&grad) {
        return false;
    }
    let (first, parts, push) = loss_partial(&op, [pred, target, loss], i, lowered);
    if parts == 1 {
        // Its first pass writes the loss itself (the scratch was not sized for it).
        return false;
    }
    out.push(first);
    use Slot::Tensor as T;
    out.push(LoweredDispatch {
        kernel: Kernel::LossGradFinish,
        bindings: vec![T(pred), T(target), Slot::LossPartial, T(loss), T(grad)],
        push,
        groups: linear_groups(op.pred_len() as u64),
        step: j,
        spec: Vec::new(),
    });
    true
}

/// One `masked_add_assign` dispatch (attributed to step `i`): `dst = mask_by > 0 ? dst + src :
/// 0` over `len` floats.
fn masked_add_assign(
    dst: TensorId,
    src: TensorId,
    mask_by: TensorId,
    len: u32,
    i: usize,
    variants: Variants,
) -> LoweredDispatch {
    use Slot::Tensor as T;
    let push = words(&[len]);
    let (kernel, bindings, groups) = if variants.direct && add_direct4_fits(len) {
        (
            Kernel::MaskedAddAssignDirect4,
            vec![T(dst), T(src), T(dst), T(mask_by)],
            linear_groups(u64::from(len / 4)),
        )
    } else {
        (
            Kernel::MaskedAddAssign,
            vec![T(dst), T(src), T(mask_by)],
            linear_groups(u64::from(len)),
        )
    };
    LoweredDispatch {
        kernel,
        bindings,
        push,
        groups,
        step: i,
        spec: Vec::new(),
    }
}

/// One `adamw_ema` dispatch (attributed to step `i`) for an AdamW update followed by the
/// average of the tensor it updated, as the trainer records them; `None` for any other pair.
fn adamw_ema(step: &Step, next: &Step, i: usize) -> Option<LoweredDispatch> {
    let (
        Step::AdamW {
            op,
            param,
            grad,
            m,
            v,
            hyper,
        },
        Step::Ema {
            param: averaged,
            ema,
            hyper: ema_hyper,
            ..
        },
    ) = (step, next)
    else {
        return None;
    };
    if averaged != param || ema_hyper != hyper {
        return None;
    }
    use Slot::Tensor as T;
    Some(LoweredDispatch {
        kernel: Kernel::AdamWEma,
        bindings: vec![T(*param), T(*grad), T(*m), T(*v), T(*hyper), T(*ema)],
        push: adamw_push(op),
        groups: linear_groups(u64::from(op.len)),
        step: i,
        spec: Vec::new(),
    })
}

/// One `sum_squares` dispatch (attributed to step `i`) for the consecutive sums of `group`
/// (`(gradient, op)`, slots in order, at most [`SUM_SQUARES_GROUP`]) into `sums`.
pub(crate) fn sum_squares(
    group: &[(TensorId, SumSquares)],
    sums: TensorId,
    i: usize,
) -> LoweredDispatch {
    assert!((1..=SUM_SQUARES_GROUP).contains(&group.len()));
    let last = group[group.len() - 1].0;
    let mut bindings: Vec<Slot> = (0..SUM_SQUARES_GROUP)
        .map(|k| Slot::Tensor(group.get(k).map_or(last, |g| g.0)))
        .collect();
    bindings.push(Slot::Tensor(sums));
    let mut push: Vec<u32> = (0..SUM_SQUARES_GROUP)
        .map(|k| group.get(k).map_or(0, |g| g.1.len))
        .collect();
    push.push(group[0].1.slot);
    LoweredDispatch {
        kernel: Kernel::SumSquares,
        bindings,
        push: words(&push),
        groups: [group.len() as u32, 1, 1],
        step: i,
        spec: Vec::new(),
    }
}

/// The push block of `adamw` and `adamw_ema`.
pub(crate) fn adamw_push(op: &AdamW) -> Vec<u8> {
    words(&[
        op.len,
        op.beta1.to_bits(),
        op.beta2.to_bits(),
        op.eps.to_bits(),
        op.weight_decay.to_bits(),
    ])
}

pub(crate) fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The 72-byte push block of every convolution kernel (`shaders/conv_push.glsl`).
pub fn conv_push(op: &Conv2d, splits: u32, chunk: u32) -> Vec<u8> {
    let push = words(&[
        op.n,
        op.c_in,
        op.h,
        op.w,
        op.c_out,
        op.kernel,
        op.stride,
        op.pad,
        op.groups,
        u32::from(op.relu),
        op.out_h(),
        op.out_w(),
        splits,
        chunk,
        0,
        0,
        0,
        0,
    ]);
    debug_assert_eq!(push.len(), CONV_PUSH_BYTES as usize);
    push
}

/// The specialisation constant that makes a kernel compiled per shape read its shape from
/// the constants after it rather than from the push block (`shaders/conv_push.glsl`).
pub const SHAPE_SPECIALISED_ID: u32 = 1;

/// A push block (`push`, of a kernel that [`KernelInfo::shapes`]: a convolution's from
/// [`conv_push`], say) as the specialisation constants of a pipeline compiled for that
/// shape: [`SHAPE_SPECIALISED_ID`] set, then word `i` as constant
/// `SHAPE_SPECIALISED_ID + 1 + i`. The dispatch still pushes the same block.
///
/// [`KernelInfo::shapes`]: super::kernels::KernelInfo::shapes
pub fn shape_constants(push: &[u8]) -> Vec<SpecConstant> {
    let words = push
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    std::iter::once(SpecConstant::bool(SHAPE_SPECIALISED_ID, true))
        .chain(
            (SHAPE_SPECIALISED_ID + 1..)
                .zip(words)
                .map(|(id, v)| SpecConstant::u32(id, v)),
        )
        .collect()
}

/// A pointwise conv's push block with `skip` set: its store adds binding 4.
pub(crate) fn with_skip(mut push: Vec<u8>) -> Vec<u8> {
    push[4 * CONV_SKIP_WORD..][..4].copy_from_slice(&1u32.to_le_bytes());
    push
}

/// The word of [`conv_push`] that says the conv has a ReLU (backward: masks its output
/// gradient by `y > 0`).
const CONV_RELU_WORD: usize = 9;
/// The word of [`conv_push`] that says a pointwise conv adds a residual (`skip`).
const CONV_SKIP_WORD: usize = 14;
/// The words of [`conv_push`] that give a conv reading the records their layout
/// (`record_stride`, then `flip`).
const CONV_RECORD_STRIDE_WORD: usize = 16;

/// The push block of the loss kernels (`shaders/loss.glsl`).
pub fn loss_push(op: &CenterLoss, parts: u32, cells_per_part: u32) -> Vec<u8> {
    let push = words(&[
        op.n,
        op.classes,
        op.grid_h,
        op.grid_w,
        op.alpha.to_bits(),
        op.beta.to_bits(),
        op.offset_weight.to_bits(),
        op.size_weight.to_bits(),
        op.giou_weight.to_bits(),
        parts,
        cells_per_part,
    ]);
    debug_assert_eq!(push.len(), LOSS_PUSH_BYTES as usize);
    push
}

/// Workgroups for a grid-stride kernel over `len` items.
pub(crate) fn linear_groups(len: u64) -> [u32; 3] {
    let groups = len
        .div_ceil(u64::from(LINEAR_WORKGROUP))
        .clamp(1, u64::from(MAX_GROUPS));
    [groups as u32, 1, 1]
}

/// Checks a grid against the limit every device supports.
pub(crate) fn checked(groups: [u64; 3], what: &'static str) -> Result<[u32; 3], StepError> {
    if groups.iter().any(|&g| g == 0 || g > u64::from(MAX_GROUPS)) {
        return Err(StepError::Grid { what, groups });
    }
    Ok([groups[0] as u32, groups[1] as u32, groups[2] as u32])
}

/// Workgroups a tiled GEMM's grid should have, its tile shrunk until it does: fewer leave a
/// GPU's cores idle (an NVIDIA H100 has 132 of them, a Mali-G610 MC4 four, each running
/// several workgroups at once).
const GEMM_FILL_GROUPS: u64 = 128;
/// How much padding a tile side may add to the side it covers and still be preferred to a
/// smaller one that pads less: a quarter.
const GEMM_PAD_ALLOWED: (u64, u64) = (5, 4);

/// The tile (rows, columns) of a tiled GEMM dispatch over an `m × n` output, `depth` grids
/// deep (images, groups or parts), with `fill`: each side the largest of [`GEMM_TILE_ROWS`] /
/// [`GEMM_TILE_COLS`] that pads it by at most a quarter (else the one that pads it least),
/// halved (the longer side first) to the default tile's area, then while the grid has fewer
/// than [`GEMM_FILL_GROUPS`] workgroups where `fill`. So small layers get tiles that are not
/// mostly padding and workgroups enough to spread over a GPU, and large ones keep the
/// default [`GEMM_TILE`], which the GPU figures were measured with. Larger tiles (to 64 × 128,
/// a third of the loads per multiply-add) are there to be forced ([`Variants::gemm_tile`])
/// and measured on a GPU.
fn gemm_tile(m: u64, n: u64, depth: u64, fill: bool) -> [u32; 2] {
    let max_area = u64::from(GEMM_TILE[0] * GEMM_TILE[1]);
    let side = |len: u64, choices: &[u32]| -> u64 {
        let padded = |c: u64| len.div_ceil(c) * c;
        let (num, den) = GEMM_PAD_ALLOWED;
        let sides = choices.iter().map(|&c| u64::from(c));
        sides
            .clone()
            .filter(|&c| padded(c) * den <= len * num)
            .max()
            .unwrap_or_else(|| sides.min_by_key(|&c| (padded(c), u64::MAX - c)).unwrap())
    };
    let (mut bm, mut bn) = (side(m, &GEMM_TILE_ROWS), side(n, &GEMM_TILE_COLS));
    let min = u64::from(GEMM_TILE_ROWS[0]);
    let groups = |bm: u64, bn: u64| m.div_ceil(bm) * n.div_ceil(bn) * depth;
    while bm * bn > max_area || (fill && groups(bm, bn) < GEMM_FILL_GROUPS) {
        if bn > bm || (bn > min && bm == min) {
            bn /= 2;
        } else if bm > min {
            bm /= 2;
        } else {
            break;
        }
    }
    [bm as u32, bn as u32]
}

/// The specialisation constants of a tiled GEMM dispatch with `tile`: none for the default.
fn tile_constants(tile: [u32; 2]) -> Vec<SpecConstant> {
    if tile == [GEMM_TILE[0], GEMM_TILE[1]] {
        return Vec::new();
    }
    GEMM_TILE_IDS
        .iter()
        .zip(tile)
        .map(|(&id, v)| SpecConstant::u32(id, v))
        .collect()
}

/// `(splits, chunk)` for a sum of `terms` terms onto outputs spread over `tiles` workgroups:
/// `chunk` a multiple of `rule.align`, `splits · chunk ≥ terms`.
pub(crate) fn split(terms: u64, tiles: u64, rule: SplitRule) -> (u32, u32) {
    let wanted = rule.target_groups.div_ceil(tiles.max(1));
    let splits = wanted.min(terms / rule.min_terms).clamp(1, MAX_SPLITS);
    let chunk = terms.div_ceil(splits).div_ceil(rule.align) * rule.align;
    let splits = terms.div_ceil(chunk);
    (splits as u32, chunk as u32)
}

/// The dispatches one step lowers to, appended to the recording's as they are made, and what
/// a step's lowering needs to know.
pub(crate) struct StepDispatches<'a> {
    out: &'a mut Vec<LoweredDispatch>,
    /// The step's index in its entry.
    pub step: usize,
    /// The residual add after the step, done in its store ([`fusion::residual_adds`]).
    pub add_after: Option<ResidualAdd>,
    pub variants: Variants,
    /// The whole lowering's scratch sizes, which a split sum grows.
    pub lowered: &'a mut Lowered,
}

impl StepDispatches<'_> {
    /// A tiled GEMM's tile over an m × n output, `depth` grids deep: [`gemm_tile`]'s, or the
    /// one the variants force.
    pub fn tile_for(&self, m: u64, n: u64, depth: u64, fill: bool) -> [u32; 2] {
        self.variants
            .gemm_tile
            .unwrap_or_else(|| gemm_tile(m, n, depth, fill))
    }

    /// A dispatch of a kernel that is not a tiled GEMM.
    pub fn add(
        &mut self,
        kernel: Kernel,
        bindings: Vec<Slot>,
        constants: Vec<u8>,
        groups: [u32; 3],
    ) {
        self.add_tiled(kernel, bindings, constants, groups, None);
    }

    /// A dispatch (its push `constants`), with its tile where the kernel is a tiled GEMM
    /// (`KernelInfo::tiles`): the tile travels as specialisation constants.
    pub fn add_tiled(
        &mut self,
        kernel: Kernel,
        bindings: Vec<Slot>,
        constants: Vec<u8>,
        groups: [u32; 3],
        tile: Option<[u32; 2]>,
    ) {
        debug_assert_eq!(bindings.len(), kernel.info().bindings as usize, "{kernel}");
        debug_assert_eq!(
            constants.len(),
            kernel.info().push_bytes as usize,
            "{kernel}"
        );
        debug_assert_eq!(tile.is_some(), kernel.info().tiles, "{kernel}");
        self.out.push(LoweredDispatch {
            kernel,
            bindings,
            push: constants,
            groups,
            step: self.step,
            spec: tile.map_or_else(Vec::new, tile_constants),
        });
    }
}

/// Appends the dispatches of `step` (entry step `index`), with the residual add after it in
/// its store where `add`; the op's own module lowers it (`compute::steps`).
fn lower_step(
    step: &Step,
    index: usize,
    add: Option<ResidualAdd>,
    variants: Variants,
    lowered: &mut Lowered,
    out: &mut Vec<LoweredDispatch>,
) -> Result<(), StepError> {
    let mut dispatches = StepDispatches {
        out,
        step: index,
        add_after: add,
        variants,
        lowered,
    };
    step.with_op(|op| op.lower(&mut dispatches))
}

#[cfg(test)]
mod tests;
