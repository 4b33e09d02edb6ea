//! The forward layers of a batch that no entry trains, run image by image: every layer for
//! the first image, then every layer for the second, each image split over the threads as a
//! batch-1 inference pass is (in bands of rows, the depthwise outputs kept out of memory),
//! where the batch's own kernels run one layer over every image before the next layer, by
//! when the first image's activations are out of cache. On a 2-core x86 machine det-m's
//! inference pass at batch 16 takes about a quarter less this way, and a fine-tune's step
//! with the backbone and neck frozen a tenth less.
//!
//! It serves a fine-tune's frozen layers (`--freeze`: their activations are not kept for a
//! backward pass) and the inference and evaluation passes of a model that does not train.
//! The layers run on a batch-1 executor of their own, made from the entry's steps with the
//! batch taken out ([`Layers::recording`]) and sharing the engine's threads; per run it
//! takes a copy of the layers' weights (the host may have loaded others since), and per
//! image the image's record in place and a copy of the outputs that later steps read. Their
//! other activations have no place in the batch's memory, only one image's worth in the
//! batch-1 executor's: a frozen backbone's activations at batch 16 were most of a fine-tune's
//! memory. Each output is the same sum, in the same order, as the batch's kernels make: the
//! results are identical.

use std::collections::HashMap;
use std::ops::Range;

use super::exec::{CpuExec, Input};
use super::fusion;
use crate::base::MemoryPlan;
use crate::compute::ops::{Add, Conv2d, Normalize, Upsample2x};
use crate::compute::recording::{AccessError, Elem, Recording, Role, Step, TensorId};

/// Fewest forward convs a run of layers needs to be worth its own executor.
const MIN_CONVS: usize = 3;

/// Where an entry's layers run image by image, and the batch-1 recording they run as.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Layers {
    /// The entry's steps it stands for.
    pub steps: Range<usize>,
    /// Images in the batch.
    images: usize,
    /// The steps for one image, as entry 0.
    pub recording: Recording,
    /// Tensors copied whole before a run (the layers' weights and biases): `(entry's,
    /// batch-1 recording's)`.
    weights: Vec<(TensorId, TensorId)>,
    /// The records the layers read, and the bytes of one.
    records: Option<(TensorId, TensorId, usize)>,
    /// Tensors later steps (or the host) read: each image's copied out after its pass.
    outputs: Vec<(TensorId, TensorId)>,
}

/// Per entry of `rec`, its layers that run image by image on `threads` threads, if any
/// ([`layers`]).
pub(super) fn every_entry(rec: &Recording, threads: usize) -> Vec<Option<Layers>> {
    let trained: Vec<TensorId> = rec
        .entries
        .iter()
        .flat_map(|e| &e.steps)
        .flat_map(Step::accesses)
        .filter(|&(t, written)| written && rec.get(t).role == Role::Param)
        .map(|(t, _)| t)
        .collect();
    (0..rec.entries.len())
        .map(|e| layers(rec, e, threads, &trained))
        .collect()
}

/// The layers of entry `entry` of `rec` that run image by image on `threads` threads, if
/// any (`trained`: the weights some entry of `rec` writes): the longest run of forward steps (normalisation, convs, adds, upsamplings) from the
/// entry's first, over a batch of two or more and at least one image a thread, that reads no
/// weight any entry trains (so that the layers are the same in every entry, inference and
/// evaluation included, and one executor serves them all) and no activation made before it,
/// and ends where no fused kernel joins it to the next step. `None` where that run holds
/// fewer than [`MIN_CONVS`] convs.
fn layers(rec: &Recording, entry: usize, threads: usize, trained: &[TensorId]) -> Option<Layers> {
    let steps = &rec.entries[entry].steps;
    let start = steps
        .iter()
        .position(|s| per_image(s, 0, |t| t).is_some())?;
    let images = steps[start].batch() as usize;
    if images < threads.max(2) {
        return None;
    }
    let mut end = start;
    while end < steps.len()
        && per_image(&steps[end], images, |t| t).is_some()
        && !steps[end].touches().iter().any(|t| trained.contains(t))
    {
        end += 1;
    }
    let joined = fusion::joined_steps(rec, entry);
    if start > 0 && joined[start - 1] {
        return None;
    }
    while end > start && joined[end - 1] {
        end -= 1;
    }
    let convs = steps[start..end]
        .iter()
        .filter(|s| matches!(s, Step::ConvForward { .. }))
        .count();
    if convs < MIN_CONVS {
        return None;
    }
    batch_one(rec, entry, start..end, images)
}

/// Per tensor of `rec`: whether it needs a place in the batch's own memory with `layers`
/// (per entry) run image by image. Not an activation that no step but those layers' touches,
/// in any entry: that lives in the batch-1 executor alone, one image's worth.
pub(super) fn placed(rec: &Recording, layers: &[Option<Layers>]) -> Vec<bool> {
    let mut placed: Vec<bool> = rec
        .tensors
        .iter()
        .map(|t| t.role != Role::Activation)
        .collect();
    for (e, entry) in rec.entries.iter().enumerate() {
        let inside = layers[e].as_ref().map_or(0..0, |l| l.steps.clone());
        let outside = entry
            .steps
            .iter()
            .enumerate()
            .filter(|(s, _)| !inside.contains(s));
        for (_, step) in outside {
            for t in step.touches() {
                placed[t.index()] = true;
            }
        }
    }
    placed
}

/// For each step of entry `entry` of `rec`: whether it runs as one kernel with the next, as
/// [`fusion::joined_steps`] says, and every step of `layers` with the next but the last:
/// the tensors they write are written image by image all through the layers' kernel.
pub(super) fn joined(rec: &Recording, entry: usize, layers: Option<&Layers>) -> Vec<bool> {
    let mut joined = fusion::joined_steps(rec, entry);
    if let Some(l) = layers {
        for j in &mut joined[l.steps.start..l.steps.end - 1] {
            *j = true;
        }
    }
    joined
}

/// The batch-1 recording of steps `range` of entry `entry`: `None` where a step reads an
/// activation made before the range (kept simple: the models' runs start at the records).
fn batch_one(rec: &Recording, entry: usize, range: Range<usize>, images: usize) -> Option<Layers> {
    let steps = &rec.entries[entry].steps;
    let by: Vec<usize> = range.clone().collect();
    let mut one = Recording::new();
    let mut ids: HashMap<TensorId, TensorId> = HashMap::new();
    let (mut weights, mut records, mut outputs) = (Vec::new(), None, Vec::new());
    let mut one_steps = Vec::with_capacity(range.len());
    for step in &steps[range.clone()] {
        for (t, written) in step.accesses() {
            if ids.contains_key(&t) {
                continue;
            }
            let tensor = rec.get(t);
            let (len, role) = match (tensor.role, tensor.elem, written) {
                (Role::Param, _, false) => (tensor.len, Role::Param),
                (Role::Input, Elem::Bytes, false) => {
                    let Step::Normalize { op, .. } = step else {
                        return None;
                    };
                    (op.record_stride as usize, Role::Input)
                }
                (Role::Activation | Role::Output, Elem::F32, true) => {
                    let private = fusion::private(rec, entry, t, &by);
                    let role = if private {
                        Role::Activation
                    } else {
                        Role::Output
                    };
                    (tensor.len / images, role)
                }
                _ => return None,
            };
            let id = one.tensor(&tensor.name, len, tensor.elem, role);
            ids.insert(t, id);
            match role {
                Role::Param => weights.push((t, id)),
                Role::Input => records = Some((t, id, len)),
                Role::Output => outputs.push((t, id)),
                _ => {}
            }
        }
        one_steps.push(per_image(step, images, |t| ids[&t])?);
    }
    one.entry("image", one_steps);
    one.validate().ok()?;
    Some(Layers {
        steps: range,
        images,
        recording: one,
        weights,
        records,
        outputs,
    })
}

/// A forward step over a batch of `images` (any batch where 0) as the same step over one
/// image, its tensors renamed by `id`; `None` for any other step.
fn per_image(step: &Step, images: usize, id: impl Fn(TensorId) -> TensorId) -> Option<Step> {
    if images != 0 && step.batch() as usize != images && !matches!(step, Step::Add { .. }) {
        return None;
    }
    Some(match *step {
        Step::Normalize { op, records, out } => Step::Normalize {
            op: Normalize { n: 1, ..op },
            records: id(records),
            out: id(out),
        },
        Step::ConvForward { op, x, w, b, y } => Step::ConvForward {
            op: Conv2d { n: 1, ..op },
            x: id(x),
            w: id(w),
            b: id(b),
            y: id(y),
        },
        Step::UpsampleForward { op, x, y } => Step::UpsampleForward {
            op: Upsample2x { n: 1, ..op },
            x: id(x),
            y: id(y),
        },
        Step::Add { op, a, b, out } if images != 0 && (op.len as usize).is_multiple_of(images) => {
            Step::Add {
                op: Add {
                    len: op.len / images as u32,
                },
                a: id(a),
                b: id(b),
                out: id(out),
            }
        }
        _ => return None,
    })
}

impl Layers {
    /// Adds what a batch-1 executor of each distinct recording of `layers` (per entry, some
    /// `None`) holds to `plan`, a line each.
    pub fn add_planned(layers: &[Option<Layers>], threads: usize, plan: &mut MemoryPlan) {
        for (i, l) in layers.iter().enumerate() {
            let Some(l) = l else { continue };
            if layers[..i]
                .iter()
                .flatten()
                .any(|o| o.recording == l.recording)
            {
                continue;
            }
            let one = CpuExec::plan_of(&l.recording, threads, false);
            plan.add(
                format!(
                    "cpu engine: {} layers run image by image (batch-1 tensors, band copies)",
                    l.steps.len()
                ),
                1,
                one.total(),
            );
        }
    }

    /// Runs the layers over every image of `main`'s batch on `one`, their batch-1 executor:
    /// the weights copied in, then per image its record (from `input` where the run was
    /// given one) read in place, the pass, and the outputs copied out into the image's part
    /// of `main`'s tensors.
    pub fn run(
        &self,
        one: &mut CpuExec,
        main: &mut CpuExec,
        input: Option<Input<'_>>,
    ) -> Result<(), AccessError> {
        for &(from, to) in &self.weights {
            let mut w = one.take(to);
            w.copy_from_slice(main.f32s(from));
            one.put(to, w);
        }
        for b in 0..self.images {
            let record = self.records.map(|(from, to, len)| {
                let all = main.bytes_of(from, input);
                let start = (b * len).min(all.len());
                (to, &all[start..(start + len).min(all.len())])
            });
            one.run_with(0, record)?;
            for &(from, to) in &self.outputs {
                let image = one.f32s(to);
                let mut out = main.take(from);
                out[b * image.len()..][..image.len()].copy_from_slice(image);
                main.put(from, out);
            }
        }
        Ok(())
    }
}
