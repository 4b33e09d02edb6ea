//! Which steps of a recording may run as one kernel, whatever the engine: the rules that
//! depend on the recording alone (who reads a tensor, in which entries). Each engine then
//! runs what its kernels can (the CPU engine: [`super::cpu`]'s fusions; the Vulkan engine:
//! a residual add in the pointwise conv's store), and plans its storage with the fused
//! kernels' spans ([`super::storage`]), so a fused kernel never finds an input overwritten
//! by its own output.
//!
//! A residual add folds into the pointwise conv (or nearest upsampling) that feeds it,
//! `out = relu?(conv(x) + bias) + skip`, only where nothing else needs the conv's output: no
//! other step of the entry touches it, and every other entry that touches it writes it first
//! with its own conv. A training entry's backward pass reads it (for the ReLU mask), so
//! training keeps the two steps; an inference entry fuses all its residual adds (four in
//! det-s).

use super::ops::{Conv2d, ConvKind, Normalize};
use super::recording::{Recording, Role, Step, TensorId};

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

/// For each step of entry `entry`: whether it is a [`Step::Normalize`] whose output nothing
/// but the next step, a [`Step::ConvForward`] the engine's kernel `fits`, reads (as for a
/// [`ResidualAdd`]), so that the conv may read the records instead and the normalised tensor
/// is never written. A training entry's backward pass normalises again into a tensor of its
/// own, so its forward pass's stem fuses too.
pub(crate) fn normalized_convs(
    rec: &Recording,
    entry: usize,
    fits: impl Fn(&Normalize, &Conv2d) -> bool,
) -> Vec<bool> {
    let steps = &rec.entries[entry].steps;
    let mut fused = vec![false; steps.len()];
    for (i, pair) in steps.windows(2).enumerate() {
        if let (Step::Normalize { op: norm, out, .. }, Step::ConvForward { op, x, w, b, y, .. }) =
            (&pair[0], &pair[1])
        {
            fused[i] = x == out
                && ![*w, *b, *y].contains(out)
                && fits(norm, op)
                && private(rec, entry, *out, [i, i + 1]);
        }
    }
    fused
}

/// Whether activation `t` is touched in entry `entry` by its steps `by` only, and every other
/// entry that touches it writes it first.
pub(crate) fn private(rec: &Recording, entry: usize, t: TensorId, by: [usize; 2]) -> bool {
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

/// Whether the first step of `steps` that touches `t` (if any) is a conv, an upsampling or a
/// normalisation that overwrites it.
fn written_first(steps: &[Step], t: TensorId) -> bool {
    match steps.iter().find(|s| s.touches().contains(&t)) {
        None => true,
        Some(Step::ConvForward { x, w, b, y, .. }) => *y == t && ![*x, *w, *b].contains(&t),
        Some(Step::UpsampleForward { x, y, .. }) => *y == t && *x != t,
        Some(Step::Normalize { out, .. }) => *out == t,
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

    #[test]
    fn a_normalisation_only_its_conv_reads_folds_into_the_conv() {
        use crate::compute::recording::Elem;
        let recording = |extra_reader: bool| {
            let mut rec = Recording::new();
            let norm = Normalize {
                n: 1,
                h: 4,
                w: 4,
                record_stride: 48,
                flip: false,
            };
            let op = Conv2d::dense(1, 3, 4, 4, 8, 3, 2, true);
            let records = rec.tensor("records", norm.input_bytes(), Elem::Bytes, Role::Input);
            let x = rec.f32("x", norm.output_len(), Role::Activation);
            let w = rec.f32("w", op.weight_len(), Role::Param);
            let b = rec.f32("b", op.bias_len(), Role::Param);
            let y = rec.f32("y", op.output_len(), Role::Output);
            let mut steps = vec![
                Step::Normalize {
                    op: norm,
                    records,
                    out: x,
                },
                Step::ConvForward { op, x, w, b, y },
            ];
            if extra_reader {
                let z = rec.f32("z", norm.output_len(), Role::Output);
                steps.push(Step::Add {
                    op: Add { len: 48 },
                    a: x,
                    b: x,
                    out: z,
                });
            }
            rec.entries.push(Entry {
                name: "forward".into(),
                steps,
            });
            rec.validate().expect("a valid recording");
            rec
        };
        let any = |_: &Normalize, _: &Conv2d| true;
        assert_eq!(normalized_convs(&recording(false), 0, any), [true, false]);
        assert_eq!(
            normalized_convs(&recording(true), 0, any),
            [false, false, false]
        );
        // Where the engine's kernel does not fit the conv, nothing fuses.
        let none = |_: &Normalize, _: &Conv2d| false;
        assert_eq!(normalized_convs(&recording(false), 0, none), [false, false]);
    }
}
