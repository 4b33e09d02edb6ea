//! Steps the CPU engine runs as one kernel:
//!
//! - a residual add folded into the pointwise conv that feeds it, `out = relu?(conv(x) +
//!   bias) + skip` in the GEMM's store ([`super::conv::pointwise_forward_add`]). The conv's
//!   own output is then never written: the add's pass over memory (reading two tensors,
//!   writing a third) is saved. Only where nothing else needs the conv's output: no other
//!   step of the entry touches it, and every other entry that touches it writes it first with
//!   its own conv. A training entry's backward pass reads it (for the ReLU mask), so training
//!   keeps the two steps; the inference entry fuses all its residual adds (four in det-s).
//!   Likewise an add after a nearest upsampling ([`super::upsampled::upsample_add`], det-s's
//!   neck): the upsampled tensor is never written.
//! - a depthwise conv and the pointwise conv that reads its output ([`super::separable`]),
//!   wherever the two follow each other; the depthwise output may be kept out of memory at
//!   batch 1 where it is private in the same sense.
//! - a nearest upsampling and the pointwise conv that reads it ([`super::upsampled`]): the
//!   conv at the small size, then the copy; where the upsampled tensor is private.

use crate::compute::ops::ConvKind;
use crate::compute::recording::{Recording, Role, Step, TensorId};

/// A residual add folded into the step before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResidualAdd {
    /// The add's other operand (the skip connection).
    pub residual: TensorId,
    /// The add's output, which the fused kernel writes.
    pub out: TensorId,
}

/// For each step of entry `entry`: the add folded into it, where the step is a pointwise
/// [`Step::ConvForward`] or an [`Step::UpsampleForward`] and the next step an [`Step::Add`] of
/// its output that may be fused (see the module docs). The add's own step is then skipped.
pub(crate) fn residual_adds(rec: &Recording, entry: usize) -> Vec<Option<ResidualAdd>> {
    let steps = &rec.entries[entry].steps;
    let mut fused = vec![None; steps.len()];
    for (i, pair) in steps.windows(2).enumerate() {
        let Step::Add { a, b, out, .. } = &pair[1] else {
            continue;
        };
        let (x, y, kind_fits) = match &pair[0] {
            Step::ConvForward { op, x, y, .. } => (x, y, op.kind() == ConvKind::Pointwise),
            Step::UpsampleForward { x, y, .. } => (x, y, true),
            _ => continue,
        };
        let residual = match (*a == *y, *b == *y) {
            (true, false) => *b,
            (false, true) => *a,
            _ => continue,
        };
        let fits = kind_fits && *out != *x;
        if fits && private(rec, entry, *y, [i, i + 1]) {
            fused[i] = Some(ResidualAdd {
                residual,
                out: *out,
            });
        }
    }
    fused
}

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
            private: private(rec, entry, *d, [i, i + 1]),
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
                && private(rec, entry, *u, [i, i + 1]);
        }
    }
    pairs
}

/// For each step of entry `entry`: whether the engine may run it and the next step as one
/// kernel (any of the fusions above, whichever `CpuExec::plan` then chooses): what
/// [`crate::compute::storage::StoragePlan::shared`] keeps apart.
pub(crate) fn joined_steps(rec: &Recording, entry: usize) -> Vec<bool> {
    let adds = residual_adds(rec, entry);
    let separable = separable_pairs(rec, entry);
    let upsampled = upsampled_pairs(rec, entry);
    let mut joined = vec![false; adds.len()];
    for i in 0..joined.len() {
        if adds[i].is_some() {
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

/// Whether activation `t` is touched in entry `entry` by its steps `by` only, and every other
/// entry that touches it writes it first.
fn private(rec: &Recording, entry: usize, t: TensorId, by: [usize; 2]) -> bool {
    let steps = &rec.entries[entry].steps;
    rec.tensors[t.index()].role == Role::Activation
        && steps
            .iter()
            .enumerate()
            .all(|(k, s)| by.contains(&k) || !s.touches().contains(&t))
        && rec
            .entries
            .iter()
            .enumerate()
            .filter(|&(e, _)| e != entry)
            .all(|(_, other)| written_first(&other.steps, t))
}

/// Whether the first step of `steps` that touches `t` (if any) is a conv or an upsampling
/// that overwrites it.
fn written_first(steps: &[Step], t: TensorId) -> bool {
    match steps.iter().find(|s| s.touches().contains(&t)) {
        None => true,
        Some(Step::ConvForward { x, w, b, y, .. }) => *y == t && ![*x, *w, *b].contains(&t),
        Some(Step::UpsampleForward { x, y, .. }) => *y == t && *x != t,
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ops::{Add, Conv2d};
    use crate::compute::recording::Entry;

    /// `x → pw → y; out = y + x`, in an entry of its own; `extra` steps appended.
    fn block(extra: impl FnOnce(&mut Recording, TensorId, TensorId) -> Vec<Step>) -> Recording {
        let mut rec = Recording::new();
        let op = Conv2d::pointwise(1, 4, 3, 3, 4, true);
        let x = rec.f32("x", op.input_len(), Role::Input);
        let w = rec.f32("w", op.weight_len(), Role::Param);
        let b = rec.f32("b", op.bias_len(), Role::Param);
        let y = rec.f32("y", op.output_len(), Role::Activation);
        let out = rec.f32("out", op.output_len(), Role::Output);
        let mut steps = vec![
            Step::ConvForward { op, x, w, b, y },
            Step::Add {
                op: Add { len: 36 },
                a: y,
                b: x,
                out,
            },
        ];
        steps.extend(extra(&mut rec, y, out));
        rec.entries.push(Entry {
            name: "forward".into(),
            steps,
        });
        rec.validate().expect("a valid recording");
        rec
    }

    #[test]
    fn an_add_of_a_private_pointwise_output_folds_into_the_conv() {
        let rec = block(|_, _, _| Vec::new());
        let fused = residual_adds(&rec, 0);
        assert_eq!(
            fused,
            [
                Some(ResidualAdd {
                    residual: TensorId(0),
                    out: TensorId(4)
                }),
                None
            ]
        );
    }

    #[test]
    fn an_output_another_step_reads_is_not_fused() {
        let rec = block(|rec, y, _| {
            let z = rec.f32("z", 36, Role::Output);
            vec![Step::Add {
                op: Add { len: 36 },
                a: y,
                b: y,
                out: z,
            }]
        });
        assert_eq!(residual_adds(&rec, 0), [None, None, None]);
    }

    #[test]
    fn an_output_another_entry_reads_before_writing_is_not_fused() {
        let mut rec = block(|_, _, _| Vec::new());
        let y = TensorId(3);
        let z = rec.f32("z", 36, Role::Output);
        rec.entries.push(Entry {
            name: "reads y".into(),
            steps: vec![Step::AddAssign {
                op: Add { len: 36 },
                dst: z,
                src: y,
            }],
        });
        assert_eq!(residual_adds(&rec, 0), [None, None]);
        // An entry that writes y with its own conv first does not stop the fusion.
        let mut rec = block(|_, _, _| Vec::new());
        let again = rec.entries[0].clone();
        rec.entries.push(again);
        assert!(residual_adds(&rec, 0)[0].is_some());
    }
}
