//! The steps a [`super::Recording`] is made of, one module per op: each op's module holds
//! what that op is to the rest of the crate — its name for reports, its validation and the
//! tensors it reads, overwrites or updates (`StepOp::uses`, which
//! [`super::Recording::validate`], the fusion rules and the storage plans build on), its
//! batch, its CPU twin (`StepOp::run_cpu`) and its
//! Vulkan dispatches (`StepOp::lower`). A new op is a line in the `steps!` list below (its
//! tensors), a module here with its `StepOp` impl (the compiler asks for every method but
//! `batch`), and its kernels (the CPU kernel, the shader and its line in the Vulkan kernel
//! list).
//!
//! What spans several steps stays where it is decided: fusing a step with its neighbours
//! ([`super::fusion`], the Vulkan lowering's joined dispatches, the CPU engine's schedule),
//! the tensors an optimizer step may write ([`super::Recording::validate`]) and the scratch
//! each engine sizes for its kernels.
//!
//! | module | steps |
//! |---|---|
//! | `conv` | `ConvForward`, `ConvBackward` |
//! | `add` | `Add`, `AddAssign` |
//! | `upsample` | `UpsampleForward`, `UpsampleBackward` |
//! | `row_copy` | `RowCopy` |
//! | `records` | `Normalize`, `Targets` (packed records in) |
//! | `loss` | `LossForward`, `LossBackward` |
//! | `clip` | `SumSquares`, `ClipGrad` |
//! | `optim` | `AdamW`, `Ema`, `Sgd` |
//! | `decode` | `Decode` |

mod add;
mod clip;
mod conv;
mod decode;
mod loss;
mod optim;
mod records;
mod row_copy;
mod upsample;

use super::cpu::exec::{CpuExec, Input};
use super::ops::{self, OpError};
use super::recording::{Elem, TensorId};
use super::vulkan::lower::{StepDispatches, StepError};

/// A tensor a step touches: `(tensor, elements it must hold, element type, how)`.
pub(crate) type Use = (TensorId, usize, Elem, Access);

/// How a step touches a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    /// Overwritten whole: the value before the step is not read.
    Write,
    /// Read and written (an accumulation, an optimizer's update, a write to part of it): the
    /// tensor carries a value from before the step, which the storage plans keep.
    Update,
}

/// What every op answers, each in its own module.
pub(crate) trait StepOp {
    /// A short name for reports (the kernel family).
    fn name(&self) -> &'static str;

    /// The op's own validation, then each tensor the step touches and how.
    fn uses(&self) -> Result<Vec<Use>, OpError>;

    /// The batch the step works on (0 for steps that have none, such as an optimizer's).
    fn batch(&self) -> u32 {
        0
    }

    /// Runs the step on the CPU engine: its tensors are `cpu`'s; `thread_split` asks for the
    /// split over threads the schedule chose; `input` stands in for a byte tensor the caller
    /// passed without copying ([`CpuExec::run_reading`]).
    fn run_cpu(&self, cpu: &mut CpuExec, thread_split: bool, input: Option<Input<'_>>);

    /// Appends the step's Vulkan dispatches.
    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError>;
}

/// The list of steps: each line makes a variant of [`Step`] (what the model and the engines
/// build and match) and a struct of the same name and fields (what the op's module implements
/// [`StepOp`] for); [`Step::with_op`] turns the one into the other.
macro_rules! steps {
    ($(
        $(#[$doc:meta])*
        $name:ident { $($(#[$field_doc:meta])* $field:ident: $ty:ty),* $(,)? }
    )*) => {
        /// One unit of work over tensors. Each variant's fields name its tensors; the op gives
        /// the shapes. Gradients are overwritten, never accumulated, except by
        /// [`Step::AddAssign`].
        #[derive(Debug, Clone, PartialEq)]
        pub enum Step {
            $($(#[$doc])* $name { $($(#[$field_doc])* $field: $ty),* },)*
        }

        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy, PartialEq)]
            pub(crate) struct $name { $($(#[$field_doc])* pub $field: $ty),* }
        )*

        impl Step {
            /// The step as its op's struct, for what every op answers ([`StepOp`]).
            pub(crate) fn with_op<R>(&self, f: impl FnOnce(&dyn StepOp) -> R) -> R {
                match *self {
                    $(Step::$name { $($field),* } => f(&$name { $($field),* }),)*
                }
            }
        }
    };
}

steps! {
    /// `y = relu?(conv(x, w) + b)`.
    ConvForward { op: ops::Conv2d, x: TensorId, w: TensorId, b: TensorId, y: TensorId }
    /// Gradients of a [`Step::ConvForward`] from its output `y` (for the ReLU mask) and the
    /// output gradient `gy`; `gx` may be left out (a first layer).
    ConvBackward {
        op: ops::Conv2d,
        x: TensorId,
        w: TensorId,
        y: TensorId,
        gy: TensorId,
        gx: Option<TensorId>,
        /// `None` for a frozen weight whose bias trains: the bias's gradient alone.
        gw: Option<TensorId>,
        gb: TensorId,
    }
    /// `out = a + b` (`out` may not be `a` or `b`).
    Add { op: ops::Add, a: TensorId, b: TensorId, out: TensorId }
    /// `dst += src` (gradient accumulation where a tensor has two consumers).
    AddAssign { op: ops::Add, dst: TensorId, src: TensorId }
    UpsampleForward { op: ops::Upsample2x, x: TensorId, y: TensorId }
    UpsampleBackward { op: ops::Upsample2x, gy: TensorId, gx: TensorId }
    /// Rows of `src` into `dst` ([`ops::RowCopy`]); the rest of `dst` is left as it is.
    RowCopy { op: ops::RowCopy, src: TensorId, dst: TensorId }
    /// Records (bytes) → network input.
    Normalize { op: ops::Normalize, records: TensorId, out: TensorId }
    /// Records (bytes) → CenterNet targets.
    Targets { op: ops::Targets, records: TensorId, out: TensorId }
    /// The loss into `loss` ([`super::recording::LOSS_LEN`] floats).
    LossForward { op: ops::CenterLoss, pred: TensorId, target: TensorId, loss: TensorId }
    /// The gradient of the loss with respect to `pred` (reads the centre count from `loss`,
    /// which a [`Step::LossForward`] earlier in the entry wrote).
    LossBackward {
        op: ops::CenterLoss,
        pred: TensorId,
        target: TensorId,
        loss: TensorId,
        grad: TensorId,
    }
    /// `sums[CLIP_SUMS + slot] = Σ x²` ([`ops::SumSquares`]; `x` a gradient).
    SumSquares { op: ops::SumSquares, x: TensorId, sums: TensorId }
    /// Gradient-norm clipping ([`ops::GradClip`]): from the sums the [`Step::SumSquares`]
    /// before it wrote, the norm and scale into `sums[..CLIP_SUMS]` and the scale into
    /// `hyper[HYPER_GRAD_SCALE]`, where the optimizer steps after it read it (the only step
    /// that writes an input: the host rewrites `hyper` before every run).
    ClipGrad { op: ops::GradClip, sums: TensorId, hyper: TensorId }
    /// AdamW over one parameter tensor, with `lr`, `step`, `c1`, `c2` and the gradient's scale
    /// from `hyper` ([`super::recording::HYPER_LEN`]); the op's own `lr` and `step` are not
    /// used.
    AdamW {
        op: ops::AdamW,
        param: TensorId,
        grad: TensorId,
        m: TensorId,
        v: TensorId,
        hyper: TensorId,
    }
    /// The weight average `ema` of `param`, with the decay from `hyper[HYPER_EMA_DECAY]`.
    Ema { op: ops::Ema, param: TensorId, ema: TensorId, hyper: TensorId }
    /// SGD with momentum, `lr` from `hyper[0]` and the gradient's scale from
    /// `hyper[HYPER_GRAD_SCALE]`; the op's own `lr` is not used.
    Sgd {
        op: ops::SgdMomentum,
        param: TensorId,
        grad: TensorId,
        velocity: TensorId,
        hyper: TensorId,
    }
    /// Detections: `dets` holds `n·top_k` detections
    /// ([`super::recording::DETECTION_BYTES`] each), `counts` one `u32` per image.
    Decode { op: ops::Decode, pred: TensorId, dets: TensorId, counts: TensorId }
}

impl Step {
    /// A short name for reports (the kernel family).
    pub fn name(&self) -> &'static str {
        self.with_op(|s| s.name())
    }

    /// The tensors the step reads or writes (none where it does not validate).
    pub(crate) fn touches(&self) -> Vec<TensorId> {
        self.uses()
            .map(|u| u.into_iter().map(|(t, ..)| t).collect())
            .unwrap_or_default()
    }

    /// `(tensor, written by this step)` for each tensor the step touches (none where it does
    /// not validate).
    pub(crate) fn accesses(&self) -> Vec<(TensorId, bool)> {
        self.uses()
            .map(|u| {
                u.into_iter()
                    .map(|(t, .., a)| (t, a != Access::Read))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The op's own validation and the tensors the step touches ([`StepOp::uses`]).
    pub(crate) fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.with_op(|s| s.uses())
    }

    /// Whether the step reads `tensor` even where it writes it ([`Access::Update`]).
    pub(crate) fn reads_before_writing(&self, tensor: TensorId) -> bool {
        self.uses().is_ok_and(|u| {
            u.iter()
                .any(|&(t, .., a)| t == tensor && a == Access::Update)
        })
    }

    /// The batch the step works on (0 for steps that have none).
    pub(crate) fn batch(&self) -> u32 {
        self.with_op(|s| s.batch())
    }
}
