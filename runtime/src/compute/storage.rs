//! Where a [`Recording`]'s tensors live, intermediate tensors whose lifetimes never overlap
//! sharing memory: an [`ArenaPlan`] places every `f32` tensor at an offset in one allocation
//! (the CPU engine), a [`StoragePlan`] maps each tensor to one of several whole buffers (the
//! Vulkan engine, whose descriptors bind buffers).
//!
//! A training step holds every forward activation until the backward pass reads it, but each
//! activation *gradient* lives only from the step that writes it to the one or two that read
//! it; with one buffer per tensor, det-s at batch 32 held 48 MiB of gradients of which at most
//! a few are ever live together. The plan is made from the recording alone, before anything is
//! allocated, so the memory budget sees the same bytes the engine allocates.
//!
//! A tensor may share only when it is an [`Role::Activation`] of `f32`s that every entry
//! writes whole before reading it (so nothing of it is carried from one run or entry to the
//! next). Its lifetime in an entry runs from that write to its last read, widened to whole
//! kernels where the engine runs consecutive steps as one (the CPU engine's fusions), so such
//! a kernel never finds an input overwritten by its own output.

use super::recording::{Elem, Recording, Role, TensorId};
use crate::base::MemoryPlan;

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

    /// Tensors whose lifetimes never overlap share a buffer. Each tensor in turn goes into
    /// the smallest buffer already at least its size that none of its tenants overlap (else
    /// the largest smaller one, which grows, else a new one); that greedy is run over a few
    /// orders (largest first; by first use, as interval colouring is; by first use within
    /// sizes) and the plan with the fewest bytes kept. Planning det-s takes microseconds.
    ///
    /// `kernels(entry)` says, for each step of the entry, whether the engine may run it and
    /// the next step as one kernel (the CPU engine's fusions; on the Vulkan engine, a
    /// pointwise conv with the residual add after it):
    /// a tensor stays live for the whole of every kernel that touches it, so a fused kernel
    /// never finds an input overwritten by its own output.
    pub fn shared(recording: &Recording, kernels: &dyn Fn(usize) -> Vec<bool>) -> StoragePlan {
        let lifetimes = lifetimes(recording, kernels);
        let len = |i: usize| recording.tensors[i].len;
        let start = |i: usize| {
            lifetimes[i]
                .as_ref()
                .and_then(|spans| spans.iter().map(|s| (s.entry, s.first)).min())
                .unwrap_or((usize::MAX, 0))
        };
        let all: Vec<usize> = (0..recording.tensors.len()).collect();
        let mut orders = Vec::new();
        let mut by_size = all.clone();
        by_size.sort_by_key(|&i| (std::cmp::Reverse(len(i)), i));
        orders.push(by_size);
        let mut by_start = all.clone();
        by_start.sort_by_key(|&i| (start(i), std::cmp::Reverse(len(i)), i));
        orders.push(by_start);
        let mut by_size_then_start = all;
        by_size_then_start.sort_by_key(|&i| (std::cmp::Reverse(len(i)), start(i), i));
        orders.push(by_size_then_start);
        orders
            .iter()
            .map(|order| assign(recording, &lifetimes, order))
            .min_by_key(StoragePlan::bytes)
            .expect("three orders")
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

/// Where each `f32` tensor of a recording sits in one arena of floats, tensors whose
/// lifetimes never overlap at overlapping offsets (for an engine that can hand out parts of
/// one allocation, as the CPU engine does). Packing by offset rather than by whole buffers
/// is what gets close to the true peak: det-s at batch 32 needs 35.5 MiB of intermediate
/// tensors live at once, which whole shared buffers hold in 51.6 MiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Floats in the arena.
    pub len: usize,
    /// Per tensor: its first float in the arena (`None` for byte tensors).
    offset: Vec<Option<usize>>,
    /// Per tensor: whether its floats are also another tensor's at other times.
    shared: Vec<bool>,
}

impl ArenaPlan {
    /// Offsets are multiples of this many floats (64 bytes: a cache line, any SIMD width).
    const ALIGN: usize = 16;

    /// Every `f32` tensor at its own offset.
    pub fn separate(recording: &Recording) -> ArenaPlan {
        let mut offset = Vec::with_capacity(recording.tensors.len());
        let mut len = 0;
        for t in &recording.tensors {
            offset.push((t.elem == Elem::F32).then_some(len));
            if t.elem == Elem::F32 {
                len += t.len.next_multiple_of(Self::ALIGN);
            }
        }
        ArenaPlan {
            len,
            offset,
            shared: vec![false; recording.tensors.len()],
        }
    }

    /// Largest tensor first, each at the lowest offset where it fits between the tensors
    /// already placed whose lifetimes overlap its own (`kernels` as for
    /// [`StoragePlan::shared`]; tensors that may not share overlap everything).
    pub fn shared(recording: &Recording, kernels: &dyn Fn(usize) -> Vec<bool>) -> ArenaPlan {
        Self::shared_among(recording, kernels, &|_| true)
    }

    /// As [`ArenaPlan::shared`], for the `f32` tensors `only` takes alone: the others get no
    /// place ([`ArenaPlan::offset`] panics for them).
    pub fn shared_among(
        recording: &Recording,
        kernels: &dyn Fn(usize) -> Vec<bool>,
        only: &dyn Fn(TensorId) -> bool,
    ) -> ArenaPlan {
        let lifetimes = lifetimes(recording, kernels);
        let n = recording.tensors.len();
        let conflict = |a: usize, b: usize| match (&lifetimes[a], &lifetimes[b]) {
            (Some(x), Some(y)) => x.iter().any(|s| y.iter().any(|t| s.overlaps(t))),
            _ => true,
        };
        let mut order: Vec<usize> = (0..n)
            .filter(|&i| recording.tensors[i].elem == Elem::F32 && only(TensorId(i as u32)))
            .collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(recording.tensors[i].len), i));
        let size = |i: usize| recording.tensors[i].len.next_multiple_of(Self::ALIGN);
        let mut offset = vec![None; n];
        let mut placed: Vec<(usize, usize, usize)> = Vec::new(); // (offset, end, tensor)
        let mut len = 0;
        for i in order {
            let mut busy: Vec<(usize, usize)> = placed
                .iter()
                .filter(|&&(_, _, j)| conflict(i, j))
                .map(|&(o, e, _)| (o, e))
                .collect();
            busy.sort_unstable();
            // The smallest gap that holds it, else the end.
            let (mut at, mut best, mut cursor) = (None, usize::MAX, 0);
            for &(o, e) in &busy {
                if o >= cursor && o - cursor >= size(i) && o - cursor < best {
                    (at, best) = (Some(cursor), o - cursor);
                }
                cursor = cursor.max(e);
            }
            let at = at.unwrap_or(cursor);
            offset[i] = Some(at);
            placed.push((at, at + size(i), i));
            len = len.max(at + size(i));
        }
        let mut shared = vec![false; n];
        for &(o, e, i) in &placed {
            shared[i] = placed.iter().any(|&(p, f, j)| j != i && p < e && o < f);
        }
        ArenaPlan {
            len,
            offset,
            shared,
        }
    }

    /// The first float of `tensor` (an `f32` tensor) in the arena.
    pub fn offset(&self, tensor: TensorId) -> usize {
        self.offset[tensor.index()].expect("an f32 tensor")
    }

    /// Whether `tensor` has a place in the arena (an `f32` tensor that
    /// [`ArenaPlan::shared_among`] did not leave out).
    pub fn holds(&self, tensor: TensorId) -> bool {
        self.offset[tensor.index()].is_some()
    }

    /// Whether `tensor`'s floats belong to another tensor at other times (its value is gone
    /// once that one is written, so the host cannot read it after a run).
    pub fn is_shared(&self, tensor: TensorId) -> bool {
        self.shared[tensor.index()]
    }

    /// Bytes of the arena.
    pub fn bytes(&self) -> u64 {
        4 * self.len as u64
    }

    /// Adds the arena to a memory plan: its parameters, optimizer state and inputs and
    /// outputs (which share nothing) as their own lines, the rest as one.
    pub fn add_to(&self, recording: &Recording, plan: &mut MemoryPlan) {
        // The tensors placed ([`ArenaPlan::shared_among`] may leave some out).
        let f32s = |roles: &[Role]| {
            let tensors: Vec<_> = recording
                .tensors
                .iter()
                .zip(&self.offset)
                .filter(|(t, at)| t.elem == Elem::F32 && roles.contains(&t.role) && at.is_some())
                .map(|(t, _)| t)
                .collect();
            let len: usize = tensors
                .iter()
                .map(|t| t.len.next_multiple_of(Self::ALIGN))
                .sum();
            (tensors.len(), 4 * len as u64)
        };
        let (n, weights) = f32s(&[Role::Param]);
        plan.add(format!("model: weights ({n} tensors)"), 1, weights);
        let (n, state) = f32s(&[Role::State]);
        if n > 0 {
            plan.add(
                format!("model: optimizer moments and weight average ({n} tensors)"),
                1,
                state,
            );
        }
        let (_, io) = f32s(&[Role::Input, Role::Output]);
        let (n, _) = f32s(&[Role::Activation]);
        plan.add(
            format!("model: activations and gradients ({n} tensors, packed by lifetime)"),
            1,
            self.bytes() - weights - state - io,
        );
        let bytes: u64 = recording
            .tensors
            .iter()
            .filter(|t| t.elem == Elem::Bytes)
            .map(|t| t.bytes())
            .sum();
        plan.add("model: batch, loss and detections", 1, io + bytes);
    }
}

/// The greedy of [`StoragePlan::shared`] over tensors in `order`.
fn assign(recording: &Recording, lifetimes: &[Lifetimes], order: &[usize]) -> StoragePlan {
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut spans: Vec<Vec<Span>> = Vec::new();
    let mut buffer_of = vec![usize::MAX; recording.tensors.len()];
    for &i in order {
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

/// Each tensor's lifetimes in every entry, or `None` for a tensor that may not share (see the
/// module docs); a lifetime covers the whole of every kernel its steps run in (`kernels`).
fn lifetimes(recording: &Recording, kernels: &dyn Fn(usize) -> Vec<bool>) -> Vec<Lifetimes> {
    let mut out: Vec<Lifetimes> = recording
        .tensors
        .iter()
        .map(|t| (t.role == Role::Activation && t.elem == Elem::F32).then(Vec::new))
        .collect();
    for (e, entry) in recording.entries.iter().enumerate() {
        // Each step's kernel, as the range of steps it runs.
        let joined = kernels(e);
        let joins = |s: usize| joined.get(s).copied().unwrap_or(false);
        let mut kernel = vec![(0, 0); entry.steps.len()];
        let mut first = 0;
        for (s, k) in kernel.iter_mut().enumerate() {
            if s == 0 || !joins(s - 1) {
                first = s;
            }
            k.0 = first;
        }
        let mut last = entry.steps.len().saturating_sub(1);
        for (s, k) in kernel.iter_mut().enumerate().rev() {
            if !joins(s) {
                last = s;
            }
            k.1 = last;
        }
        let mut open: Vec<Option<Span>> = vec![None; recording.tensors.len()];
        for (s, step) in entry.steps.iter().enumerate() {
            for (id, writes) in step.accesses() {
                let i = id.index();
                match &mut open[i] {
                    Some(span) => span.last = kernel[s].1,
                    // First touched here: it must be a whole write.
                    None if writes && !step.reads_before_writing(id) => {
                        open[i] = Some(Span {
                            entry: e,
                            first: kernel[s].0,
                            last: kernel[s].1,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ops::{Add, Conv2d};
    use crate::compute::recording::Step;

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

    /// No kernel runs two steps.
    fn one_step_kernels(_: usize) -> Vec<bool> {
        Vec::new()
    }

    #[test]
    fn activations_share_once_their_lifetimes_end() {
        // a: steps 0..=1, b: 1..=2, c: 2..=3: a and c never live together.
        let (r, [x, a, b, c, y]) = chain();
        let plan = StoragePlan::shared(&r, &one_step_kernels);
        assert_eq!(plan.buffer_of(a), plan.buffer_of(c));
        assert_ne!(plan.buffer_of(a), plan.buffer_of(b));
        assert_ne!(plan.buffer_of(b), plan.buffer_of(c));
        assert_eq!(plan.bytes(), r.bytes() - r.get(c).bytes());
        // Inputs, parameters and outputs never share.
        let (w, bias) = (TensorId(1), TensorId(2));
        for t in [x, w, bias, y] {
            assert!(!plan.is_shared(t));
        }
    }

    #[test]
    fn steps_run_as_one_kernel_keep_their_tensors_apart() {
        // Steps 1 and 2 as one kernel (a fused pair): a (read by step 1) and c (written by
        // step 2) are then live together, and nothing shares.
        let (r, [_, a, b, c, _]) = chain();
        let pair = |_: usize| vec![false, true, false, false];
        let plan = StoragePlan::shared(&r, &pair);
        assert_eq!(plan.bytes(), r.bytes());
        assert!(![a, b, c].iter().any(|&t| plan.is_shared(t)));
        // No two tensors touched by one kernel share.
        let steps = &r.entries[0].steps;
        for p in steps[1].touches().into_iter().chain(steps[2].touches()) {
            for q in steps[1].touches().into_iter().chain(steps[2].touches()) {
                if p != q {
                    assert_ne!(plan.buffer_of(p), plan.buffer_of(q), "{p:?} {q:?}");
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
        let plan = StoragePlan::shared(&r, &one_step_kernels);
        assert!(!plan.is_shared(acc));
        // t0 lives over steps 1..=2, t1 over 2..=3: t0 and t2 may share.
        assert_ne!(plan.buffer_of(t[0]), plan.buffer_of(t[1]));
        assert_eq!(plan.buffer_of(t[0]), plan.buffer_of(t[2]));
    }
}
