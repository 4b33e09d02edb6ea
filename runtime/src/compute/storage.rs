//! Where a [`Recording`]'s tensors live: a [`StoragePlan`] maps each tensor to a buffer, and
//! intermediate tensors whose lifetimes never overlap share one.
//!
//! A training step holds every forward activation until the backward pass reads it, but each
//! activation *gradient* lives only from the step that writes it to the one or two that read
//! it; with one buffer per tensor, det-s at batch 32 held 48 MiB of gradients of which at most
//! a few are ever live together. The plan is made from the recording alone, before anything is
//! allocated, so the memory budget sees the same bytes the engine allocates.
//!
//! A tensor may share only when it is an [`Role::Activation`] of `f32`s that every entry
//! writes whole before reading it (so nothing of it is carried from one run or entry to the
//! next). Its lifetime in an entry runs from that write to its last read, widened by one step
//! on each side: an engine may run up to three consecutive steps as one kernel (the CPU
//! engine's fusions), and the widening keeps such a kernel's inputs and outputs apart.

use super::recording::{Elem, Recording, Role, Step, TensorId};
use crate::balance::MemoryPlan;

/// One buffer of a [`StoragePlan`] and the tensors it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffer {
    /// Elements (`f32`s or bytes): the largest of its tensors.
    pub len: usize,
    pub elem: Elem,
    pub tensors: Vec<TensorId>,
}

impl Buffer {
    /// Bytes of storage, as [`super::recording::Tensor::bytes`] counts them.
    pub fn bytes(&self) -> u64 {
        match self.elem {
            Elem::F32 => 4 * self.len as u64,
            Elem::Bytes => (self.len as u64).div_ceil(4) * 4,
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoragePlan {
    pub buffers: Vec<Buffer>,
    /// Per tensor, the index of its buffer.
    buffer_of: Vec<usize>,
}

/// Where a tensor is live in one entry: steps `first..=last`, widened (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    entry: usize,
    first: usize,
    last: usize,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.entry == other.entry && self.first <= other.last && other.first <= self.last
    }
}

/// A tensor's lifetimes: `None` where it must keep its own buffer.
type Lifetimes = Option<Vec<Span>>;

impl StoragePlan {
    /// One buffer per tensor (an engine whose tensors the host reads after a run, such as a
    /// comparison of every intermediate activation).
    pub fn separate(recording: &Recording) -> StoragePlan {
        StoragePlan {
            buffers: recording
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| Buffer {
                    len: t.len,
                    elem: t.elem,
                    tensors: vec![TensorId(i as u32)],
                })
                .collect(),
            buffer_of: (0..recording.tensors.len()).collect(),
        }
    }

    /// Tensors whose lifetimes never overlap share a buffer. Greedy, largest tensor first,
    /// each into the smallest buffer already at least its size that none of its tenants
    /// overlap (else the largest smaller one, which grows, else a new one).
    pub fn shared(recording: &Recording) -> StoragePlan {
        let lifetimes = lifetimes(recording);
        let mut order: Vec<usize> = (0..recording.tensors.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(recording.tensors[i].len), i));
        let mut buffers: Vec<Buffer> = Vec::new();
        let mut spans: Vec<Vec<Span>> = Vec::new();
        let mut buffer_of = vec![usize::MAX; recording.tensors.len()];
        for i in order {
            let t = &recording.tensors[i];
            let id = TensorId(i as u32);
            let chosen = lifetimes[i].as_ref().and_then(|mine| {
                let free = |b: usize| {
                    spans[b].iter().all(|s| mine.iter().all(|m| !m.overlaps(s)))
                        && buffers[b].elem == t.elem
                        && buffers[b]
                            .tensors
                            .iter()
                            .all(|o| lifetimes[o.index()].is_some())
                };
                let candidates = (0..buffers.len()).filter(|&b| free(b));
                // Smallest at least as large; else the largest (it grows the least).
                candidates
                    .clone()
                    .filter(|&b| buffers[b].len >= t.len)
                    .min_by_key(|&b| buffers[b].len)
                    .or_else(|| candidates.max_by_key(|&b| buffers[b].len))
            });
            let b = match chosen {
                Some(b) => {
                    buffers[b].len = buffers[b].len.max(t.len);
                    buffers[b].tensors.push(id);
                    b
                }
                None => {
                    buffers.push(Buffer {
                        len: t.len,
                        elem: t.elem,
                        tensors: vec![id],
                    });
                    spans.push(Vec::new());
                    buffers.len() - 1
                }
            };
            if let Some(mine) = &lifetimes[i] {
                spans[b].extend_from_slice(mine);
            }
            buffer_of[i] = b;
        }
        StoragePlan { buffers, buffer_of }
    }

    /// The buffer `tensor` lives in.
    pub fn buffer_of(&self, tensor: TensorId) -> usize {
        self.buffer_of[tensor.index()]
    }

    /// Whether `tensor` shares its buffer with another (its value is gone once another
    /// tenant is written, so the host cannot read it after a run).
    pub fn is_shared(&self, tensor: TensorId) -> bool {
        self.buffers[self.buffer_of(tensor)].tensors.len() > 1
    }

    /// Bytes of every buffer.
    pub fn bytes(&self) -> u64 {
        self.buffers.iter().map(Buffer::bytes).sum()
    }

    /// Adds the plan's buffers to a memory plan, one line per kind of tensor (a buffer's
    /// tenants share one role: only activations share).
    pub fn add_to(&self, recording: &Recording, plan: &mut MemoryPlan) {
        let of = |roles: &[Role]| {
            let buffers: Vec<&Buffer> = self
                .buffers
                .iter()
                .filter(|b| roles.contains(&recording.get(b.tensors[0]).role))
                .collect();
            let tensors: usize = buffers.iter().map(|b| b.tensors.len()).sum();
            let bytes: u64 = buffers.iter().map(|b| b.bytes()).sum();
            (tensors, buffers.len(), bytes)
        };
        let (n, _, bytes) = of(&[Role::Param]);
        plan.add(format!("model: weights ({n} tensors)"), 1, bytes);
        let (n, _, bytes) = of(&[Role::State]);
        if n > 0 {
            plan.add(
                format!("model: optimizer moments and weight average ({n} tensors)"),
                1,
                bytes,
            );
        }
        let (n, buffers, bytes) = of(&[Role::Activation]);
        let sharing = if buffers < n {
            format!("{n} tensors in {buffers} buffers")
        } else {
            format!("{n} tensors")
        };
        plan.add(
            format!("model: activations and gradients ({sharing})"),
            1,
            bytes,
        );
        let (n, _, bytes) = of(&[Role::Input, Role::Output]);
        plan.add(
            format!("model: batch, loss and detections ({n} tensors)"),
            1,
            bytes,
        );
    }
}

/// Each tensor's lifetimes in every entry, or `None` for a tensor that may not share (see the
/// module docs).
fn lifetimes(recording: &Recording) -> Vec<Lifetimes> {
    let mut out: Vec<Lifetimes> = recording
        .tensors
        .iter()
        .map(|t| (t.role == Role::Activation && t.elem == Elem::F32).then(Vec::new))
        .collect();
    for (e, entry) in recording.entries.iter().enumerate() {
        let mut open: Vec<Option<Span>> = vec![None; recording.tensors.len()];
        for (s, step) in entry.steps.iter().enumerate() {
            for (id, writes) in step.accesses() {
                let i = id.index();
                match &mut open[i] {
                    Some(span) => span.last = s + 1,
                    // First touched here: it must be a whole write.
                    None if writes && !reads_before_writing(step, id) => {
                        open[i] = Some(Span {
                            entry: e,
                            first: s.saturating_sub(1),
                            last: s + 1,
                        })
                    }
                    None => out[i] = None,
                }
            }
        }
        for (i, span) in open.into_iter().enumerate() {
            if let (Some(spans), Some(span)) = (&mut out[i], span) {
                spans.push(span);
            }
        }
    }
    out
}

/// Whether `step` reads `tensor` even where it writes it (an accumulation or an optimizer's
/// update): such a tensor carries a value from before the step.
fn reads_before_writing(step: &Step, tensor: TensorId) -> bool {
    match *step {
        Step::AddAssign { dst, .. } => dst == tensor,
        Step::AdamW { param, m, v, .. } => [param, m, v].contains(&tensor),
        Step::Sgd {
            param, velocity, ..
        } => [param, velocity].contains(&tensor),
        Step::Ema { ema, .. } => ema == tensor,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ops::{Add, Conv2d};

    /// x → a → b → c → y (pointwise convs), every intermediate an activation.
    fn chain() -> (Recording, [TensorId; 5]) {
        let mut r = Recording::new();
        let op = Conv2d::pointwise(1, 4, 2, 2, 4, true);
        let x = r.f32("x", op.input_len(), Role::Input);
        let w = r.f32("w", op.weight_len(), Role::Param);
        let bias = r.f32("bias", op.bias_len(), Role::Param);
        let a = r.f32("a", op.output_len(), Role::Activation);
        let b = r.f32("b", op.output_len(), Role::Activation);
        let c = r.f32("c", op.output_len(), Role::Activation);
        let y = r.f32("y", op.output_len(), Role::Output);
        let conv = |x, y| Step::ConvForward {
            op,
            x,
            w,
            b: bias,
            y,
        };
        r.entry(
            "forward",
            vec![conv(x, a), conv(a, b), conv(b, c), conv(c, y)],
        );
        r.validate().unwrap();
        (r, [x, a, b, c, y])
    }

    #[test]
    fn separate_gives_every_tensor_its_own_buffer() {
        let (r, _) = chain();
        let plan = StoragePlan::separate(&r);
        assert_eq!(plan.buffers.len(), r.tensors.len());
        assert_eq!(plan.bytes(), r.bytes());
    }

    #[test]
    fn activations_share_only_three_steps_apart() {
        // a: steps 0..1, b: 1..2, c: 2..3; widened by one, a and c still meet (steps 1..2),
        // so nothing shares in a chain this short.
        let (r, [x, a, b, c, y]) = chain();
        let plan = StoragePlan::shared(&r);
        assert_eq!(plan.bytes(), r.bytes());
        assert!(![x, a, b, c, y].iter().any(|&t| plan.is_shared(t)));

        // In a longer chain the first and the last activation are far enough apart.
        let mut r = r;
        let steps = r.entries[0].steps.clone();
        let op = Conv2d::pointwise(1, 4, 2, 2, 4, true);
        let d = r.f32("d", op.output_len(), Role::Activation);
        let e = r.f32("e", op.output_len(), Role::Activation);
        let (w, bias) = (TensorId(1), TensorId(2));
        let conv = |x, y| Step::ConvForward {
            op,
            x,
            w,
            b: bias,
            y,
        };
        r.entries[0].steps = vec![
            steps[0].clone(),
            steps[1].clone(),
            steps[2].clone(),
            conv(c, d),
            conv(d, e),
            conv(e, y),
        ];
        r.validate().unwrap();
        let plan = StoragePlan::shared(&r);
        // a (0..=2 widened) and e (3..=6 widened) may share; so may a and d? d: 2..=5: no.
        assert_eq!(plan.buffer_of(a), plan.buffer_of(e));
        assert_ne!(plan.buffer_of(a), plan.buffer_of(d));
        assert!(plan.bytes() < r.bytes());
        // Inputs, parameters and outputs never share.
        for t in [x, w, bias, y] {
            assert!(!plan.is_shared(t));
        }
        // No two tensors touched by one step, or by steps within three of each other, share.
        let steps = &r.entries[0].steps;
        for (i, s) in steps.iter().enumerate() {
            for near in &steps[i..(i + 3).min(steps.len())] {
                for p in s.touches() {
                    for q in near.touches() {
                        if p != q {
                            assert_ne!(plan.buffer_of(p), plan.buffer_of(q), "{p:?} {q:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_tensor_read_before_written_keeps_its_buffer() {
        // `acc` is accumulated into before any write in the entry: it carries a value.
        let mut r = Recording::new();
        let add = Add { len: 4 };
        let src = r.f32("src", 4, Role::Input);
        let acc = r.f32("acc", 4, Role::Activation);
        let t: Vec<_> = (0..6)
            .map(|i| r.f32(&format!("t{i}"), 4, Role::Activation))
            .collect();
        let out = r.f32("out", 4, Role::Output);
        let mut steps = vec![Step::AddAssign {
            op: add,
            dst: acc,
            src,
        }];
        let mut prev = src;
        for &ti in &t {
            steps.push(Step::Add {
                op: add,
                a: prev,
                b: src,
                out: ti,
            });
            prev = ti;
        }
        steps.push(Step::Add {
            op: add,
            a: prev,
            b: src,
            out,
        });
        r.entry("e", steps);
        r.validate().unwrap();
        let plan = StoragePlan::shared(&r);
        assert!(!plan.is_shared(acc));
        assert!(plan.is_shared(t[0]));
        assert_ne!(plan.buffer_of(t[0]), plan.buffer_of(t[3]));
        assert_eq!(plan.buffer_of(t[0]), plan.buffer_of(t[4]));
    }
}
