//! Steps the CPU engine runs as one kernel:
//!
//! - a residual add folded into the pointwise conv that feeds it, `out = relu?(conv(x) +
//!   bias) + skip` in the GEMM's store ([`super::conv::pointwise_forward_add`]), where
//!   [`crate::compute::fusion`]'s rule allows it. The conv's own output is then never
//!   written: the add's pass over memory (reading two tensors, writing a third) is saved.
//!   Likewise an add after a nearest upsampling ([`super::upsampled::upsample_add`], det-s's
//!   neck): the upsampled tensor is never written.
//! - a depthwise conv and the pointwise conv that reads its output ([`super::separable`]),
//!   wherever the two follow each other; the depthwise output may be kept out of memory at
//!   batch 1 where it is private in the same sense.
//! - a nearest upsampling and the pointwise conv that reads it ([`super::upsampled`]): the
//!   conv at the small size, then the copy; where the upsampled tensor is private.
//! - the normalisation of the records and the stem that reads it ([`super::stem`]): the stem
//!   normalises the rows it needs as it builds its panels, where
//!   [`crate::compute::fusion::normalized_convs`] allows it.
//! - a conv's backward pass and the residual's gradient added into its input gradient, that
//!   input gradient masked for the ReLU layer before, or both, image by image while each is
//!   in cache ([`super::conv::conv2d_backward_with`]), where
//!   [`crate::compute::fusion::grad_stores`] allows it.

use crate::compute::recording::{Recording, Step};

use crate::compute::fusion::normalized_convs;
pub(crate) use crate::compute::fusion::{
    grad_stores, private, residual_adds, GradStore, ResidualAdd,
};

/// A depthwise conv run with the pointwise conv after it (see [`super::separable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Separable {
    /// Whether nothing but the pointwise conv reads the depthwise output (as for a
    /// [`ResidualAdd`]), so that a batch-1 pass need not write it.
    pub private: bool,
}

/// For each step of entry `entry`: whether it is a depthwise [`Step::ConvForward`] whose
/// output the next step, a pointwise conv, reads as a pair [`super::separable::fuses`].
pub(crate) fn separable_pairs(rec: &Recording, entry: usize) -> Vec<Option<Separable>> {
    let steps = &rec.entries[entry].steps;
    let mut pairs = vec![None; steps.len()];
    for (i, pair) in steps.windows(2).enumerate() {
        let (
            Step::ConvForward {
                op: dw,
                x: dx,
                y: d,
                ..
            },
            Step::ConvForward {
                op: pw,
                x: px,
                y: py,
                ..
            },
        ) = (&pair[0], &pair[1])
        else {
            continue;
        };
        if px != d || py == d || py == dx || !super::separable::fuses(dw, pw) {
            continue;
        }
        pairs[i] = Some(Separable {
            private: private(rec, entry, *d, &[i, i + 1]),
        });
    }
    pairs
}

/// For each step of entry `entry`: whether it is an upsampling whose private output the next
/// step, a pointwise conv, reads as a pair [`super::upsampled::fuses`].
pub(crate) fn upsampled_pairs(rec: &Recording, entry: usize) -> Vec<bool> {
    let steps = &rec.entries[entry].steps;
    let mut pairs = vec![false; steps.len()];
    for (i, pair) in steps.windows(2).enumerate() {
        if let (
            Step::UpsampleForward { op: up, x, y: u },
            Step::ConvForward {
                op: pw, x: px, y, ..
            },
        ) = (&pair[0], &pair[1])
        {
            pairs[i] = px == u
                && y != x
                && super::upsampled::fuses(up, pw)
                && private(rec, entry, *u, &[i, i + 1]);
        }
    }
    pairs
}

/// For each step of entry `entry`: whether it is a [`Step::Normalize`] whose output only the
/// next step, a stem [`super::stem::fuses`] with, reads.
pub(crate) fn normalized_stems(rec: &Recording, entry: usize) -> Vec<bool> {
    normalized_convs(rec, entry, super::stem::fuses)
}

/// For each step of entry `entry`: whether the engine may run it and the next step as one
/// kernel (any of the fusions above, whichever `CpuExec::plan` then chooses): what
/// [`crate::compute::storage::StoragePlan::shared`] keeps apart.
pub(crate) fn joined_steps(rec: &Recording, entry: usize) -> Vec<bool> {
    let adds = residual_adds(rec, entry);
    let separable = separable_pairs(rec, entry);
    let upsampled = upsampled_pairs(rec, entry);
    let stems = normalized_stems(rec, entry);
    let grads = grad_stores(rec, entry);
    let mut joined = vec![false; adds.len()];
    for i in 0..joined.len() {
        let grad_add = grads.store[i].is_some_and(|s| s.add.is_some());
        if adds[i].is_some() || stems[i] || grad_add {
            joined[i] = true;
        }
        if separable[i].is_some() || upsampled[i] {
            joined[i] = true;
            // The pair's pointwise conv may take the add after it into its store.
            if adds.get(i + 1).is_some_and(Option::is_some) {
                joined[i + 1] = true;
            }
        }
    }
    joined
}
