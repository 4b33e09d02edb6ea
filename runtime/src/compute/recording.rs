//! A [`Recording`]: the work of a model step as data — named tensors and, per *entry* (a
//! training step, an inference pass), the list of [`Step`]s over them. Built once; each engine
//! turns it into what it runs (the Vulkan engine: one command buffer per entry, replayed; the
//! CPU engine: the Rust twin of each step, in order).
//!
//! Because both engines take the same recording and [`Recording::validate`] checks every
//! step's tensors against its op's sizes up front, the two engines cannot disagree about a
//! buffer, and [`Recording::bytes`] is the whole memory the step needs, known before anything
//! is allocated (the memory budget).
//!
//! Tensors are `f32` ([`Elem::F32`]) or raw bytes ([`Elem::Bytes`]: packed records, detection
//! output). Per-step scalars that change every step (the learning rate, the optimizer's step
//! count) live in a small host-written tensor (`hyper`), never in the recorded commands, so a
//! recorded command buffer stays valid for the whole run.

use super::ops::OpError;
pub use super::steps::Step;

/// Index of a tensor in its [`Recording`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a tensor's elements are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    /// Raw bytes (a multiple of 4 in storage: GPU buffers are read as 32-bit words).
    Bytes,
}

impl std::fmt::Display for Elem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Elem::F32 => "floats",
            Elem::Bytes => "bytes",
        })
    }
}

/// Why the host may not read or write a tensor as it asked: the checks both engines make
/// ([`Recording::host_access`], and each engine's own for tensors sharing memory).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("tensor {0} does not exist")]
    NoSuchTensor(u32),
    #[error("entry {entry} of a recording with {entries}")]
    NoSuchEntry { entry: usize, entries: usize },
    #[error("tensor {name:?} holds {held}, not {asked}")]
    WrongElem {
        name: String,
        held: Elem,
        asked: Elem,
    },
    #[error("tensor {name:?} holds {len} {elem}; {given} given")]
    WrongLength {
        name: String,
        elem: Elem,
        len: usize,
        given: usize,
    },
    #[error(
        "tensor {name:?} shares its memory with other intermediate tensors: the host cannot \
         read or write it (set the engine up with `separate`)"
    )]
    Shared { name: String },
    #[error(
        "tensor {name:?} is an activation of layers the engine runs image by image, which it \
         does not hold: the host cannot read or write it (set the engine up with `separate`)"
    )]
    NotHeld { name: String },
}

/// What a tensor is for: decides where an engine puts it and what the host may do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Written by the host before a run (the batch of records, `hyper`).
    Input,
    /// Model weights: written at start (initialisation, checkpoint), read back to save.
    Param,
    /// Optimizer state: like parameters, saved with checkpoints.
    State,
    /// Intermediate values, never touched by the host.
    Activation,
    /// Read by the host after a run (loss, detections).
    Output,
}

/// A tensor declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    /// Elements (`f32`s or bytes).
    pub len: usize,
    pub elem: Elem,
    pub role: Role,
}

impl Tensor {
    /// Bytes of storage: `4·len` for `f32`, `len` rounded up to 4 for bytes.
    pub fn bytes(&self) -> u64 {
        match self.elem {
            Elem::F32 => 4 * self.len as u64,
            Elem::Bytes => (self.len as u64).div_ceil(4) * 4,
        }
    }
}

/// Floats in a loss output tensor: `[total, focal, offset L1, size L1, centres, GIoU]`, the
/// box terms weighted and everything already divided by `max(1, centres)` but `centres`.
pub const LOSS_LEN: usize = 6;

/// Floats in the `hyper` tensor an optimizer step reads: `[lr, step, c1, c2, ema_decay,
/// grad_scale]`, where `step` counts from 1 (exact in `f32` up to 2²⁴), `c1, c2` are the bias
/// corrections [`super::ops::AdamW::bias_corrections`] of that step and `ema_decay` the weight average's
/// ([`super::ops::ema_decay`]), all computed by the host; `grad_scale` multiplies every
/// gradient the optimizer reads: the host writes 1 and a [`Step::ClipGrad`] overwrites it.
pub const HYPER_LEN: usize = 6;

/// Where [`Step::Ema`] reads its decay in the `hyper` tensor.
pub const HYPER_EMA_DECAY: usize = 4;

/// Where the optimizer steps read the gradients' scale in the `hyper` tensor.
pub const HYPER_GRAD_SCALE: usize = 5;

/// Bytes of one detection ([`super::ops::Detection`]): six 4-byte words.
pub const DETECTION_BYTES: usize = 24;

/// A named list of steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub steps: Vec<Step>,
}

/// Tensors and entries: see the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    pub tensors: Vec<Tensor>,
    pub entries: Vec<Entry>,
}

impl Recording {
    pub fn new() -> Self {
        Recording::default()
    }

    /// Declares a tensor of `len` elements.
    pub fn tensor(&mut self, name: &str, len: usize, elem: Elem, role: Role) -> TensorId {
        self.tensors.push(Tensor {
            name: name.to_owned(),
            len,
            elem,
            role,
        });
        TensorId(self.tensors.len() as u32 - 1)
    }

    /// Declares an `f32` tensor.
    pub fn f32(&mut self, name: &str, len: usize, role: Role) -> TensorId {
        self.tensor(name, len, Elem::F32, role)
    }

    /// Adds an entry; returns its index.
    pub fn entry(&mut self, name: &str, steps: Vec<Step>) -> usize {
        self.entries.push(Entry {
            name: name.to_owned(),
            steps,
        });
        self.entries.len() - 1
    }

    pub fn get(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    /// The tensor `id`, checked to hold `elem`s and `given` of them: exactly, or with
    /// `prefix` at most (byte tensors are written and read in part).
    pub fn host_access(
        &self,
        id: TensorId,
        elem: Elem,
        given: usize,
        prefix: bool,
    ) -> Result<&Tensor, AccessError> {
        let t = self
            .tensors
            .get(id.index())
            .ok_or(AccessError::NoSuchTensor(id.0))?;
        if t.elem != elem {
            return Err(AccessError::WrongElem {
                name: t.name.clone(),
                held: t.elem,
                asked: elem,
            });
        }
        if given > t.len || (!prefix && given != t.len) {
            return Err(AccessError::WrongLength {
                name: t.name.clone(),
                elem,
                len: t.len,
                given,
            });
        }
        Ok(t)
    }

    /// Checks that the recording has entry `entry`.
    pub fn check_entry(&self, entry: usize) -> Result<(), AccessError> {
        if entry < self.entries.len() {
            return Ok(());
        }
        Err(AccessError::NoSuchEntry {
            entry,
            entries: self.entries.len(),
        })
    }

    /// The tensor named `name`.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors
            .iter()
            .position(|t| t.name == name)
            .map(|i| TensorId(i as u32))
    }

    /// The entry named `name`.
    pub fn find_entry(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.name == name)
    }

    /// Storage bytes of every tensor (what an engine allocates for them).
    pub fn bytes(&self) -> u64 {
        self.tensors.iter().map(Tensor::bytes).sum()
    }

    /// Checks every step: its op is valid, its tensors exist, have the op's sizes and element
    /// types, and nothing is written as a parameter except by an optimizer step. The error
    /// names the entry, the step and the tensor.
    pub fn validate(&self) -> Result<(), RecordingError> {
        let mut names = std::collections::HashSet::new();
        for t in &self.tensors {
            if t.len == 0 {
                return Err(RecordingError::EmptyTensor(t.name.clone()));
            }
            if !names.insert(t.name.as_str()) {
                return Err(RecordingError::DuplicateName(t.name.clone()));
            }
        }
        for entry in &self.entries {
            for (i, step) in entry.steps.iter().enumerate() {
                self.check_step(step)
                    .map_err(|problem| RecordingError::Step {
                        entry: entry.name.clone(),
                        step: i,
                        kind: step.name(),
                        problem,
                    })?;
            }
        }
        Ok(())
    }

    /// [`Recording::validate`] of one step.
    fn check_step(&self, step: &Step) -> Result<(), StepProblem> {
        for (id, len, elem, access) in step.uses()? {
            let writes = access != super::steps::Access::Read;
            let t = self
                .tensors
                .get(id.index())
                .ok_or(StepProblem::NoTensor(id))?;
            // Byte tensors (records) may hold more than an op reads: a whole slot of
            // page-rounded records.
            let fits = match elem {
                Elem::F32 => t.len == len,
                Elem::Bytes => t.len >= len,
            };
            if t.elem != elem || !fits {
                return Err(StepProblem::WrongTensor {
                    tensor: t.name.clone(),
                    len: t.len,
                    elem: t.elem,
                    needs: len,
                    needs_elem: elem,
                });
            }
            let optimizer = matches!(
                step,
                Step::AdamW { .. } | Step::Sgd { .. } | Step::Ema { .. }
            );
            if writes && matches!(t.role, Role::Param | Role::State) && !optimizer {
                return Err(StepProblem::WritesParam {
                    tensor: t.name.clone(),
                    role: t.role,
                });
            }
            let clip_scale = matches!(step, Step::ClipGrad { hyper, .. } if *hyper == id);
            if writes && t.role == Role::Input && !clip_scale {
                return Err(StepProblem::WritesInput(t.name.clone()));
            }
        }
        Ok(())
    }
}

/// Why [`Recording::validate`] refused a recording.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordingError {
    #[error("tensor {0:?} has no elements")]
    EmptyTensor(String),
    #[error("two tensors are named {0:?}")]
    DuplicateName(String),
    /// Step `step` of entry `entry`, a step of kind `kind` ([`Step::name`]).
    #[error("entry {entry:?}, step {step} ({kind}): {problem}")]
    Step {
        entry: String,
        step: usize,
        kind: &'static str,
        problem: StepProblem,
    },
}

/// What is wrong with one step of a recording.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepProblem {
    /// Its op's description ([`OpError`]).
    #[error(transparent)]
    Op(#[from] OpError),
    #[error("tensor {} does not exist", .0 .0)]
    NoTensor(TensorId),
    /// A tensor of another length or element type than the op's.
    #[error("tensor {tensor:?} is {len} {elem:?}; the op needs {needs} {needs_elem:?}")]
    WrongTensor {
        tensor: String,
        len: usize,
        elem: Elem,
        needs: usize,
        needs_elem: Elem,
    },
    /// A parameter or optimizer state written by a step that is not an optimizer's.
    #[error("writes {tensor:?}, a {role:?} tensor (only optimizer steps may)")]
    WritesParam { tensor: String, role: Role },
    #[error("writes the input tensor {0:?}")]
    WritesInput(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ops::{Add, Conv2d};

    fn small() -> (Recording, TensorId, TensorId) {
        let mut r = Recording::new();
        let op = Conv2d::pointwise(1, 2, 3, 3, 4, true);
        let x = r.f32("x", op.input_len(), Role::Input);
        let w = r.f32("w", op.weight_len(), Role::Param);
        let b = r.f32("b", op.bias_len(), Role::Param);
        let y = r.f32("y", op.output_len(), Role::Output);
        r.entry("forward", vec![Step::ConvForward { op, x, w, b, y }]);
        (r, w, y)
    }

    #[test]
    fn host_access_checks_the_tensor_its_elements_and_their_count() {
        let (mut r, w, y) = small();
        let records = r.tensor("records", 10, Elem::Bytes, Role::Input);
        let len = r.get(w).len;
        assert_eq!(r.host_access(w, Elem::F32, len, false).unwrap().name, "w");
        assert_eq!(
            r.host_access(TensorId(99), Elem::F32, 1, false),
            Err(AccessError::NoSuchTensor(99))
        );
        let e = r.host_access(y, Elem::Bytes, 1, true).unwrap_err();
        assert_eq!(e.to_string(), "tensor \"y\" holds floats, not bytes");
        // f32 tensors whole, byte tensors in part but not beyond their end.
        let short = r.host_access(w, Elem::F32, len - 1, false).unwrap_err();
        assert!(matches!(short, AccessError::WrongLength { given, .. } if given == len - 1));
        assert!(r.host_access(records, Elem::Bytes, 4, true).is_ok());
        let e = r.host_access(records, Elem::Bytes, 11, true).unwrap_err();
        assert_eq!(e.to_string(), "tensor \"records\" holds 10 bytes; 11 given");
        assert!(r.check_entry(0).is_ok());
        assert_eq!(
            r.check_entry(1),
            Err(AccessError::NoSuchEntry {
                entry: 1,
                entries: 1
            })
        );
    }

    #[test]
    fn only_the_clip_writes_an_input_and_only_hyper() {
        use crate::compute::ops::GradClip;
        let mut r = Recording::new();
        let op = GradClip {
            tensors: 1,
            max_norm: 1.0,
        };
        let sums = r.f32("sums", op.sums_len(), Role::Output);
        let hyper = r.f32("hyper", HYPER_LEN, Role::Input);
        let other = r.f32("other", HYPER_LEN, Role::Input);
        r.entry("clip", vec![Step::ClipGrad { op, sums, hyper }]);
        r.validate().unwrap();
        r.entries[0].steps[0] = Step::ClipGrad {
            op,
            sums: other,
            hyper,
        };
        let e = r.validate().unwrap_err().to_string();
        assert!(
            e.contains("\"other\" is 6") || e.contains("input tensor \"other\""),
            "{e}"
        );
        r.entries[0].steps[0] = Step::Add {
            op: Add {
                len: HYPER_LEN as u32,
            },
            a: other,
            b: other,
            out: hyper,
        };
        assert!(r
            .validate()
            .unwrap_err()
            .to_string()
            .contains("writes the input tensor \"hyper\""));
    }

    #[test]
    fn sizes_are_checked_against_the_ops() {
        let (mut r, _, _) = small();
        r.validate().unwrap();
        assert_eq!(r.bytes(), 4 * (18 + 8 + 4 + 36));
        r.tensors[3].len = 35;
        let e = r.validate().unwrap_err();
        assert!(
            matches!(
                &e,
                RecordingError::Step {
                    step: 0,
                    kind: "pointwise",
                    problem: StepProblem::WrongTensor {
                        len: 35,
                        needs: 36,
                        ..
                    },
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "entry \"forward\", step 0 (pointwise): tensor \"y\" is 35 F32; the op needs 36 F32"
        );
    }

    #[test]
    fn only_optimizers_write_parameters() {
        let (mut r, w, y) = small();
        let op = Add { len: 8 };
        r.entry(
            "bad",
            vec![Step::AddAssign {
                op,
                dst: w,
                src: r.find("w").unwrap(),
            }],
        );
        assert!(r
            .validate()
            .unwrap_err()
            .to_string()
            .contains("same tensor"));
        r.entries.pop();
        let g = r.f32("g", 8, Role::Activation);
        r.entry("bad", vec![Step::AddAssign { op, dst: w, src: g }]);
        assert!(matches!(
            r.validate().unwrap_err(),
            RecordingError::Step {
                problem: StepProblem::WritesParam {
                    role: Role::Param,
                    ..
                },
                ..
            }
        ));
        assert_eq!(r.find("y"), Some(y));
        assert_eq!(r.find_entry("bad"), Some(1));
    }

    #[test]
    fn duplicate_names_and_empty_tensors_are_refused() {
        let (mut r, _, _) = small();
        r.f32("x", 3, Role::Activation);
        assert_eq!(r.validate(), Err(RecordingError::DuplicateName("x".into())));
        let (mut r, _, _) = small();
        r.f32("empty", 0, Role::Activation);
        assert_eq!(
            r.validate().unwrap_err().to_string(),
            "tensor \"empty\" has no elements"
        );
    }
}
