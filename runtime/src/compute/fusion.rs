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
        if fits && private(rec, entry, *y, &[i, i + 1]) {
            fused[i] = Some(ResidualAdd {
                residual,
                out: *out,
            });
        }
    }
    fused
}

/// What a conv's backward pass may do in the store of its input gradient `gx`, where
/// [`grad_stores`] allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GradStore {
    /// The [`Step::AddAssign`] right after it adds this tensor into `gx`: the gradient's
    /// other contribution (a residual's), added in the store; the add's own step is skipped.
    pub add: Option<TensorId>,
    /// `gx` is masked by the conv's input `> 0`: the input is a ReLU output, and the one step
    /// that reads `gx` afterwards is that ReLU conv's backward pass, which then takes its
    /// output gradient as already masked ([`GradStores::gy_masked`]).
    pub relu_of_input: bool,
}

/// The backward steps' [`GradStore`]s of an entry and the output gradients they mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GradStores {
    /// For each step: the store of a [`Step::ConvBackward`] that does more than write `gx`.
    pub store: Vec<Option<GradStore>>,
    /// For each step: a [`Step::ConvBackward`] of a ReLU conv whose output gradient an
    /// earlier step's store masks, that step (an engine that leaves that mask out must
    /// leave this one's mask in).
    pub gy_masked: Vec<Option<usize>>,
}

/// For each step of entry `entry`, what its input gradient's store may also do (see
/// [`GradStore`]): a residual's contribution added (the [`Step::AddAssign`] of another
/// tensor into `gx` right after it), and the ReLU mask of the layer before applied, where
/// `gx` then becomes that layer's output gradient with nothing else touching it before its
/// backward pass. Same values, bit for bit, as the separate steps: `gx + add` is the add's
/// sum, and masking `gx` by the input (that layer's output) `> 0` is what that layer's
/// backward pass would do first. Saves a pass over the gradient for each (det-s's training
/// step: five adds and 13 masks).
pub(crate) fn grad_stores(rec: &Recording, entry: usize) -> GradStores {
    let steps = &rec.entries[entry].steps;
    let mut out = GradStores {
        store: vec![None; steps.len()],
        gy_masked: vec![None; steps.len()],
    };
    for (i, step) in steps.iter().enumerate() {
        let Step::ConvBackward {
            x,
            w,
            y,
            gy,
            gx: Some(gx),
            gw,
            gb,
            ..
        } = *step
        else {
            continue;
        };
        let mut store = GradStore::default();
        let mut last = i;
        if let Some(&Step::AddAssign { dst, src, .. }) = steps.get(i + 1) {
            if dst == gx && src != gx && src != gb && gw != Some(src) {
                store.add = Some(src);
                last = i + 1;
            }
        }
        // The next step that touches gx, if it is a ReLU conv's backward pass reading it as
        // its output gradient with this conv's input as its output, and gx is private to
        // these steps.
        let next = steps
            .iter()
            .enumerate()
            .skip(last + 1)
            .find(|(_, s)| s.touches().contains(&gx));
        if let Some((
            j,
            &Step::ConvBackward {
                op,
                y: relu_out,
                gy: g,
                gx: gx_j,
                ..
            },
        )) = next
        {
            if op.relu
                && g == gx
                && relu_out == x
                && gx_j != Some(gx)
                && ![w, y, gy].contains(&gx)
                && private(rec, entry, gx, &[i, last, j])
            {
                store.relu_of_input = true;
                out.gy_masked[j] = Some(i);
            }
        }
        if store != GradStore::default() {
            out.store[i] = Some(store);
        }
    }
    out
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
                && private(rec, entry, *out, &[i, i + 1]);
        }
    }
    fused
}

/// Whether activation `t` is touched in entry `entry` by its steps `by` only, and every other
/// entry that touches it writes it first.
pub(crate) fn private(rec: &Recording, entry: usize, t: TensorId, by: &[usize]) -> bool {
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

/// Whether the first step of `steps` that touches `t` (if any) overwrites it without reading
/// it first: a conv, an upsampling, a normalisation or an add writing it from other tensors.
fn written_first(steps: &[Step], t: TensorId) -> bool {
    match steps.iter().find(|s| s.touches().contains(&t)) {
        None => true,
        Some(Step::ConvForward { x, w, b, y, .. }) => *y == t && ![*x, *w, *b].contains(&t),
        Some(Step::UpsampleForward { x, y, .. }) => *y == t && *x != t,
        Some(Step::Normalize { out, .. }) => *out == t,
        Some(Step::Add { a, b, out, .. }) => *out == t && ![*a, *b].contains(&t),
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

    /// The backward steps of `x → a = relu(pw(x)) → dw(a)` (output gradient `gb`), the
    /// depthwise input gradient `ga` getting a residual's `skip` after it; `relu_a`: the
    /// pointwise conv has its ReLU; `extra` steps (given `ga` and the pointwise conv's input
    /// gradient) go after the add.
    fn backward_pair(relu_a: bool, extra: impl Fn(TensorId, TensorId) -> Vec<Step>) -> Recording {
        let mut rec = Recording::new();
        let pw = Conv2d::pointwise(1, 4, 4, 4, 4, relu_a);
        let dw = Conv2d::depthwise(1, 4, 4, 4, 3, 1, true);
        let t = |rec: &mut Recording, name: &str, len: usize, role| rec.f32(name, len, role);
        let x = t(&mut rec, "x", pw.input_len(), Role::Input);
        let a = t(&mut rec, "a", pw.output_len(), Role::Input);
        let b = t(&mut rec, "b", dw.output_len(), Role::Input);
        let gb = t(&mut rec, "gb", dw.output_len(), Role::Input);
        let skip = t(&mut rec, "skip", dw.input_len(), Role::Input);
        let ga = t(&mut rec, "ga", dw.input_len(), Role::Activation);
        let gx = t(&mut rec, "gx", pw.input_len(), Role::Output);
        let lens = [
            ("w_dw", dw.weight_len()),
            ("gw_dw", dw.weight_len()),
            ("gb_dw", dw.bias_len()),
            ("w_pw", pw.weight_len()),
            ("gw_pw", pw.weight_len()),
            ("gb_pw", pw.bias_len()),
        ];
        // Weights are parameters; their gradients outputs.
        let params: Vec<TensorId> = lens
            .iter()
            .map(|&(name, len)| {
                let role = if name.starts_with('w') {
                    Role::Param
                } else {
                    Role::Output
                };
                t(&mut rec, name, len, role)
            })
            .collect();
        let mut steps = vec![
            Step::ConvBackward {
                op: dw,
                x: a,
                w: params[0],
                y: b,
                gy: gb,
                gx: Some(ga),
                gw: Some(params[1]),
                gb: params[2],
            },
            Step::AddAssign {
                op: Add {
                    len: dw.input_len() as u32,
                },
                dst: ga,
                src: skip,
            },
        ];
        steps.extend(extra(ga, gx));
        steps.push(Step::ConvBackward {
            op: pw,
            x,
            w: params[3],
            y: a,
            gy: ga,
            gx: Some(gx),
            gw: Some(params[4]),
            gb: params[5],
        });
        rec.entries.push(Entry {
            name: "backward".into(),
            steps,
        });
        rec.validate().expect("a valid recording");
        rec
    }

    #[test]
    fn an_input_gradient_store_takes_the_add_after_it_and_the_relu_mask_before_it() {
        let rec = backward_pair(true, |_, _| Vec::new());
        let stores = grad_stores(&rec, 0);
        let add = Some(rec.find("skip").unwrap());
        assert_eq!(
            stores.store,
            [
                Some(GradStore {
                    add,
                    relu_of_input: true
                }),
                None,
                None
            ]
        );
        assert_eq!(stores.gy_masked, [None, None, Some(0)]);
        // No ReLU before: the add only.
        let stores = grad_stores(&backward_pair(false, |_, _| Vec::new()), 0);
        let want = GradStore {
            add,
            relu_of_input: false,
        };
        assert_eq!(stores.store[0], Some(want));
        assert_eq!(stores.gy_masked, [None; 3]);
        // Another step reads the gradient before the ReLU conv's backward pass: it needs
        // the unmasked values.
        let rec = backward_pair(true, |ga, gx| {
            vec![Step::AddAssign {
                op: Add { len: 64 },
                dst: gx,
                src: ga,
            }]
        });
        let stores = grad_stores(&rec, 0);
        assert_eq!(stores.store[0].map(|s| s.relu_of_input), Some(false));
        assert!(stores.gy_masked.iter().all(Option::is_none));
    }
}
