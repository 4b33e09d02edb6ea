//! What the CPU executor runs for an entry: its steps, some run as one kernel
//! ([`super::fusion`] says which may), and which of those kernels read and write tensors in
//! bands of rows ([`super::band_copies`]).

use std::ops::Range;

use super::band_copies::BandedKernel;
use super::fusion::{self, GradStore, ResidualAdd};
use super::kernels;
use crate::compute::ops::ConvKind;
use crate::compute::recording::{Recording, Step};

/// One kernel of a run: a step, or steps run as one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kernel {
    /// Step `i`, on its own.
    Step(usize),
    /// Pointwise conv `i` with the add after it in its store.
    ConvAdd(usize, ResidualAdd),
    /// Upsampling `i` with the add after it in its copy
    /// ([`super::upsampled::upsample_add`]).
    UpsampleAdd(usize, ResidualAdd),
    /// Depthwise conv `i` and pointwise conv `i + 1`, with the add after them where given;
    /// with `bands`, each image split over the threads in bands of rows, the depthwise
    /// output kept out of memory ([`super::separable::forward_bands`]), else the batch split
    /// ([`super::separable::forward_images`]).
    Separable {
        i: usize,
        add: Option<ResidualAdd>,
        bands: bool,
    },
    /// Upsampling `i` and pointwise conv `i + 1`, the conv at the small size
    /// ([`super::upsampled`]), with the add after them where given.
    Upsampled { i: usize, add: Option<ResidualAdd> },
    /// Normalisation `i` and the stem `i + 1` reading the records
    /// ([`super::stem::forward_normalized`]).
    NormalizedStem(usize),
    /// Steps `first..end`, forward layers whose weights the entry does not train, run
    /// image by image on a batch-1 executor of their own ([`super::image_major`]).
    ImageMajor { first: usize, end: usize },
    /// Conv backward pass `i` doing more in its input gradient's store (and the add after it,
    /// where `store` has one), or taking its output gradient as masked already
    /// ([`super::conv::conv2d_backward_with`]).
    Backward {
        i: usize,
        store: Option<GradStore>,
        gy_masked: bool,
    },
}

impl Kernel {
    /// The steps of the entry it runs.
    pub(super) fn steps(self) -> Range<usize> {
        let (first, count) = match self {
            Kernel::Step(i) => (i, 1),
            Kernel::ConvAdd(i, _) | Kernel::UpsampleAdd(i, _) | Kernel::NormalizedStem(i) => (i, 2),
            Kernel::Separable { i, add, .. } | Kernel::Upsampled { i, add } => {
                (i, 2 + usize::from(add.is_some()))
            }
            Kernel::Backward { i, store, .. } => {
                (i, 1 + usize::from(store.is_some_and(|s| s.add.is_some())))
            }
            Kernel::ImageMajor { first, end } => (first, end - first),
        };
        first..first + count
    }
}

/// The kernels of entry `entry` of `rec` on `threads` threads: its steps in order, those
/// that run as one together (see [`super::fusion`]). A batch-1 pair keeps the depthwise
/// output out of memory only where nothing else reads it and the pointwise conv was measured
/// faster split (`thread_split`, per step).
pub(super) fn schedule(
    rec: &Recording,
    entry: usize,
    threads: usize,
    fusion: bool,
    thread_split: &[bool],
) -> Vec<Kernel> {
    let steps = &rec.entries[entry].steps;
    if !fusion {
        return (0..steps.len()).map(Kernel::Step).collect();
    }
    let adds = fusion::residual_adds(rec, entry);
    let pairs = fusion::separable_pairs(rec, entry);
    let upsampled = fusion::upsampled_pairs(rec, entry);
    let stems = fusion::normalized_stems(rec, entry);
    let grads = fusion::grad_stores(rec, entry);
    let mut plan = Vec::with_capacity(steps.len());
    let mut i = 0;
    while i < steps.len() {
        let kernel = match (pairs[i], &steps[i]) {
            (Some(pair), Step::ConvForward { op, .. }) => {
                let add = adds.get(i + 1).copied().flatten();
                if (op.n as usize) >= threads {
                    Some(Kernel::Separable {
                        i,
                        add,
                        bands: false,
                    })
                } else if pair.private && thread_split[i + 1] {
                    Some(Kernel::Separable {
                        i,
                        add,
                        bands: true,
                    })
                } else {
                    None
                }
            }
            _ if stems[i] => Some(Kernel::NormalizedStem(i)),
            _ if upsampled[i] => Some(Kernel::Upsampled {
                i,
                add: adds.get(i + 1).copied().flatten(),
            }),
            _ if grads.store[i].is_some() || grads.gy_masked[i].is_some() => {
                Some(Kernel::Backward {
                    i,
                    store: grads.store[i],
                    gy_masked: grads.gy_masked[i].is_some(),
                })
            }
            _ => None,
        };
        let kernel = kernel.unwrap_or(match (adds[i], &steps[i]) {
            (Some(add), Step::UpsampleForward { .. }) => Kernel::UpsampleAdd(i, add),
            (Some(add), _) => Kernel::ConvAdd(i, add),
            (None, _) => Kernel::Step(i),
        });
        plan.push(kernel);
        i = kernel.steps().end;
    }
    plan
}

/// Kernel `kernel` of entry `entry` on `threads` threads with the splits `thread_split`, as
/// a kernel that reads and writes tensors in bands, where it runs so (the batch-1 kernels
/// split in bands of rows: [`super::banded`], [`super::separable::forward_bands`], the
/// stem's row split).
pub(super) fn banded_kernel(
    rec: &Recording,
    entry: usize,
    kernel: Kernel,
    threads: usize,
    thread_split: &[bool],
) -> Option<BandedKernel> {
    let steps = &rec.entries[entry].steps;
    let pointwise_split = |i: usize| {
        matches!(&steps[i], Step::ConvForward { op, .. } if op.kind() == ConvKind::Pointwise)
            && thread_split[i]
            && threads > 1
            && kernels::active().gemm_fused.is_some()
    };
    // A conv's input and output, and its output's rows.
    let conv = |i: usize| match steps[i] {
        Step::ConvForward { op, x, y, .. } => (x, y, op.out_h() as usize),
        _ => unreachable!("fusion: step {i} is a conv"),
    };
    let (reads, writes, rows) = match kernel {
        Kernel::Separable {
            i,
            add,
            bands: true,
        } => {
            let (y, rows) = (conv(i + 1).1, conv(i + 1).2);
            let reads = [Some(conv(i).0), add.map(|a| a.residual)];
            (reads, add.map_or(y, |a| a.out), rows)
        }
        Kernel::NormalizedStem(i) if thread_split[i + 1] && threads > 1 => {
            ([None, None], conv(i + 1).1, conv(i + 1).2)
        }
        Kernel::Step(i) if pointwise_split(i) => {
            let (x, y, rows) = conv(i);
            ([Some(x), None], y, rows)
        }
        Kernel::ConvAdd(i, add) if pointwise_split(i) => {
            let (x, _, rows) = conv(i);
            ([Some(x), Some(add.residual)], add.out, rows)
        }
        Kernel::UpsampleAdd(i, add) => match steps[i] {
            Step::UpsampleForward { op, x, .. } if threads > 1 && (op.n as usize) < threads => {
                ([Some(x), Some(add.residual)], add.out, 2 * op.h as usize)
            }
            _ => return None,
        },
        _ => return None,
    };
    Some(BandedKernel {
        steps: kernel.steps(),
        reads,
        writes,
        rows,
    })
}
