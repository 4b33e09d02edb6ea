//! The model as a [`Recording`]: forward layers, the loss, the backward pass derived from the
//! forward one, and the optimizer, over named tensors.
//!
//! Entries (by name, see [`ENTRY_TRAIN`] …):
//!
//! - `train`: records → targets, normalise → forward → loss → backward → (with
//!   [`GraphOptions::clip_norm`]: every gradient's sum of squares, then the clip) → AdamW on
//!   every parameter tensor, then its weight average (EMA). One call is one training step.
//! - `eval`: records → targets, normalise → forward → loss and decode (no update): validation
//!   loss and detections in one pass.
//! - `infer`: records → normalise → forward → decode: detections.
//!
//! The backward pass is derived mechanically from the list of forward nodes, walked in
//! reverse. A tensor's gradient is the sum of its consumers' contributions: the first one is
//! taken as is (a residual add passes its output gradient through without a copy), later ones
//! are added with one add kernel, into a buffer no other gradient shares (so an in-place add
//! can never change a gradient still to be read).

use std::collections::HashMap;

use super::arch::{Arch, SepBlock};
use super::checkpoint::StateTensor;
use crate::compute::ops::{self, AdamW, CenterLoss, Conv2d, Decode, Normalize, RowCopy, Targets};
use crate::compute::recording::{Elem, Recording, Role, Step, TensorId, HYPER_LEN, LOSS_LEN};
use crate::format::RecordLayout;

pub const ENTRY_TRAIN: &str = "train";
pub const ENTRY_EVAL: &str = "eval";
pub const ENTRY_INFER: &str = "infer";

/// What to build besides inference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphOptions {
    /// Build the `train` entry (gradients and optimizer state are allocated only then).
    pub train: bool,
    /// Decode threshold on the sigmoid score (low for evaluation: mAP needs the whole curve).
    pub threshold: f32,
    /// Detections kept per image.
    pub top_k: u32,
    /// AdamW hyper-parameters (the learning rate comes per step, in `hyper`).
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Weight of the loss's GIoU term ([`CenterLoss::giou_weight`]; 0: none).
    pub giou_weight: f32,
    /// Clip the gradients' global norm to this before each update ([`ops::GradClip`]; `None`:
    /// no clipping, and no steps for it).
    pub clip_norm: Option<f32>,
    /// Regression weight of the cells around each box's centre
    /// ([`Targets::neighbour_weight`]; 0: the centre alone).
    pub neighbour_weight: f32,
    /// How far, in cells, those neighbours reach ([`Targets::neighbour_radius`]).
    pub neighbour_radius: u32,
    /// The most neighbour cells a box weighs in full ([`Targets::neighbour_cells`]; 0: no
    /// limit).
    pub neighbour_cells: u32,
    /// The layers that do not train ([`Freeze`]).
    pub freeze: Freeze,
    /// The frozen layers' biases train all the same (TinyTL's cheapest form): the backward
    /// pass then runs through the frozen layers for their input gradients, but sums no
    /// weight gradient there, and only the biases get optimizer state.
    pub train_biases: bool,
}

/// Which layers a training run leaves as they are (fine-tuning: the rest adapts). A frozen
/// layer gets no weight gradient, no optimizer state and no weight average, and the backward
/// pass stops before it: its activations are read by nothing after the forward pass, so they
/// live only as long as inference needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Freeze {
    /// Every layer trains.
    #[default]
    None,
    /// The stem and the blocks up to stride 8 stay (edges and textures, which carry over to
    /// new objects); the deeper blocks, the neck and the heads train.
    Early,
    /// The stem and the blocks stay; the neck and the heads train.
    Backbone,
    /// The stem, the blocks and the neck stay; the heads train.
    #[serde(rename = "backbone+neck")]
    BackboneNeck,
}

impl Freeze {
    /// Every choice, from training the most to the least.
    pub const ALL: [Freeze; 4] = [
        Freeze::None,
        Freeze::Early,
        Freeze::Backbone,
        Freeze::BackboneNeck,
    ];
    pub const NAMES: &'static str = "none, early, backbone or backbone+neck";

    /// The name `--freeze` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Freeze::None => "none",
            Freeze::Early => "early",
            Freeze::Backbone => "backbone",
            Freeze::BackboneNeck => "backbone+neck",
        }
    }

    /// How many of `arch`'s blocks stay, from the first.
    fn frozen_blocks(self, arch: &Arch) -> usize {
        match self {
            Freeze::None => 0,
            Freeze::Early => arch.skip_block + 1,
            Freeze::Backbone | Freeze::BackboneNeck => arch.blocks.len(),
        }
    }

    fn neck(self) -> bool {
        self == Freeze::BackboneNeck
    }
}

impl std::str::FromStr for Freeze {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Freeze::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| crate::base::UnknownChoice::new("--freeze", s, Freeze::NAMES))
    }
}

impl std::fmt::Display for Freeze {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Default for GraphOptions {
    fn default() -> Self {
        GraphOptions {
            train: true,
            threshold: 0.01,
            top_k: 100,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 5e-4,
            giou_weight: 0.0,
            clip_norm: None,
            neighbour_weight: 0.0,
            neighbour_radius: 1,
            neighbour_cells: 0,
            freeze: Freeze::None,
            train_biases: false,
        }
    }
}

impl GraphOptions {
    /// The `hyper` tensor of optimizer step `step` (from 1) at learning rate `lr`, with these
    /// options' AdamW betas ([`AdamW::hyper`]).
    pub fn hyper(&self, lr: f32, step: u32) -> [f32; crate::compute::recording::HYPER_LEN] {
        AdamW {
            len: 1,
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: 0.0,
            step,
        }
        .hyper()
    }
}

/// One parameter tensor and what trains it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamTensors {
    pub name: String,
    pub value: TensorId,
    /// Left as it is by training ([`GraphOptions::freeze`]): no gradient, moments or average.
    pub frozen: bool,
    /// Gradient, first and second moments and the weight average (only with `train`, and
    /// not for a frozen parameter).
    pub grad: Option<TensorId>,
    pub m: Option<TensorId>,
    pub v: Option<TensorId>,
    pub ema: Option<TensorId>,
}

/// The built recording and the tensors the host touches.
#[derive(Debug, Clone)]
pub struct ModelGraph {
    pub arch: Arch,
    pub batch: u32,
    pub layout: RecordLayout,
    pub recording: Recording,
    /// Input: `batch` records back to back (bytes).
    pub records: TensorId,
    /// Input: the step's hyper-parameters ([`HYPER_LEN`]; only read by `train`, whose clip step
    /// rewrites the gradients' scale in it).
    pub hyper: TensorId,
    /// Output: `[total, focal, offset, size, centres, giou]`.
    pub loss: TensorId,
    /// Output: the network output, `batch × (K+4) × cells`, the cells of every output level
    /// one after another ([`ops::Levels`]; one level: `batch × (K+4) × grid × grid`).
    pub pred: TensorId,
    /// Output: detections and per-image counts.
    pub dets: TensorId,
    pub counts: TensorId,
    /// Output, with gradient clipping: `[norm, scale, ...]` of the last training step
    /// ([`ops::GradClip`]: the gradients' global norm before clipping and the factor they
    /// were multiplied by).
    pub grad_norm: Option<TensorId>,
    pub params: Vec<ParamTensors>,
    pub decode: Decode,
}

/// One forward node, as the backward pass needs it.
#[derive(Debug, Clone, Copy)]
enum Node {
    Conv {
        op: Conv2d,
        x: TensorId,
        w: usize,
        y: TensorId,
    },
    Add {
        a: TensorId,
        b: TensorId,
        out: TensorId,
    },
    Upsample {
        op: ops::Upsample2x,
        x: TensorId,
        y: TensorId,
    },
    /// One level's output `x` copied into its cells of the whole output `y`.
    Gather {
        op: RowCopy,
        x: TensorId,
        y: TensorId,
    },
}

struct Builder {
    rec: Recording,
    n: u32,
    nodes: Vec<Node>,
    forward: Vec<Step>,
    params: Vec<ParamTensors>,
    /// Biases, by the index of their weight in `params`.
    bias_of: HashMap<usize, usize>,
    /// The layers made now are frozen.
    frozen: bool,
    /// Their biases train all the same ([`GraphOptions::train_biases`]).
    train_biases: bool,
}

impl Builder {
    fn param(&mut self, name: &str, len: usize) -> usize {
        let value = self.rec.f32(name, len, Role::Param);
        let trains_anyway = self.train_biases && name.ends_with(".bias");
        self.params.push(ParamTensors {
            name: name.to_owned(),
            value,
            frozen: self.frozen && !trains_anyway,
            grad: None,
            m: None,
            v: None,
            ema: None,
        });
        self.params.len() - 1
    }

    /// `y = relu?(conv(x))`, with new weight and bias parameters `name.weight`, `name.bias`.
    fn conv(&mut self, name: &str, op: Conv2d, x: TensorId) -> TensorId {
        let w = self.param(&format!("{name}.weight"), op.weight_len());
        let b = self.param(&format!("{name}.bias"), op.bias_len());
        self.bias_of.insert(w, b);
        let y = self.rec.f32(name, op.output_len(), Role::Activation);
        self.forward.push(Step::ConvForward {
            op,
            x,
            w: self.params[w].value,
            b: self.params[b].value,
            y,
        });
        self.nodes.push(Node::Conv { op, x, w, y });
        y
    }

    fn add(&mut self, name: &str, a: TensorId, b: TensorId) -> TensorId {
        let len = self.rec.get(a).len as u32;
        let out = self.rec.f32(name, len as usize, Role::Activation);
        self.forward.push(Step::Add {
            op: ops::Add { len },
            a,
            b,
            out,
        });
        self.nodes.push(Node::Add { a, b, out });
        out
    }

    fn upsample(&mut self, name: &str, op: ops::Upsample2x, x: TensorId) -> TensorId {
        let y = self.rec.f32(name, op.output_len(), Role::Activation);
        self.forward.push(Step::UpsampleForward { op, x, y });
        self.nodes.push(Node::Upsample { op, x, y });
        y
    }

    /// One pointwise conv at `side × side`.
    fn pointwise(&mut self, name: &str, x: TensorId, c_in: u32, c_out: u32, side: u32) -> TensorId {
        let op = Conv2d::pointwise(self.n, c_in, side, side, c_out, true);
        self.conv(name, op, x)
    }

    /// A level's head on `x` (`c × side × side`): depthwise, pointwise, then the 1×1 conv to
    /// the `out` output channels (no ReLU).
    fn head(&mut self, name: &str, x: TensorId, arch: &Arch, side: u32) -> TensorId {
        let dw = Conv2d::depthwise(self.n, arch.neck, side, side, 3, 1, true);
        let d = self.conv(&format!("{name}.dw"), dw, x);
        let p = self.pointwise(&format!("{name}.pw"), d, arch.neck, arch.head, side);
        let out = Conv2d::pointwise(
            self.n,
            arch.head,
            side,
            side,
            arch.config.out_channels(),
            false,
        );
        self.conv(&format!("{name}.out"), out, p)
    }

    /// The top-down neck over the backbone's `features` (each block's output and side): the
    /// finest level's input and side, and the coarser levels' inputs (p4, p5) with three
    /// levels.
    fn neck(
        &mut self,
        arch: &Arch,
        features: &[(TensorId, u32)],
    ) -> (TensorId, u32, Vec<(TensorId, u32)>) {
        let (c3, s3) = features[arch.skip_block];
        let (c4, s4) = features[arch.c4_block];
        // The top-down neck. Each pointwise conv runs before the upsampling after it, at the
        // small size: nearest upsampling copies pixels and a pointwise conv (with its ReLU)
        // works per pixel, so the two commute exactly, and this order does a quarter of the
        // work forward and backward and keeps no large upsampled input for the weight
        // gradient.
        // The coarser levels' inputs (p4, p5), with three levels.
        let mut coarse = Vec::new();
        let (p4, p4_channels) = if let Some(c5_block) = arch.c5_block() {
            let (c5, s5) = features[c5_block];
            let c5_channels = arch.blocks[c5_block].c_out;
            let p5 = self.pointwise("neck.p5", c5, c5_channels, arch.neck, s5);
            let up5 = ops::Upsample2x {
                n: self.n,
                c: arch.neck,
                h: s5,
                w: s5,
            };
            let u5 = self.upsample("neck.p5.up", up5, p5);
            let c4_channels = arch.blocks[arch.c4_block].c_out;
            let l4 = self.pointwise("neck.p4", c4, c4_channels, arch.neck, s4);
            let p4 = self.add("neck.p4.out", l4, u5);
            coarse = vec![(p4, s4), (p5, s5)];
            (p4, arch.neck)
        } else {
            (c4, arch.blocks[arch.c4_block].c_out)
        };
        let nk = self.pointwise("neck.pw", p4, p4_channels, arch.neck, s4);
        let up = ops::Upsample2x {
            n: self.n,
            c: arch.neck,
            h: s4,
            w: s4,
        };
        debug_assert_eq!(2 * s4, s3);
        let u = self.upsample("neck.up", up, nk);
        let p3 = self.add("neck.out", u, c3);
        (p3, s3, coarse)
    }

    /// AdamW and the weight average, for every parameter that trains (their state tensors
    /// made here).
    fn optimizer_steps(&mut self, options: &GraphOptions, hyper: TensorId) -> Vec<Step> {
        let mut steps = Vec::with_capacity(2 * self.params.len());
        for i in 0..self.params.len() {
            let p = &self.params[i];
            if p.frozen {
                continue;
            }
            let len = self.rec.get(p.value).len;
            let name = p.name.clone();
            let m = self
                .rec
                .f32(&StateTensor::AdamM.name(&name), len, Role::State);
            let v = self
                .rec
                .f32(&StateTensor::AdamV.name(&name), len, Role::State);
            let grad = self.params[i]
                .grad
                .expect("every trained parameter has a gradient");
            self.params[i].m = Some(m);
            self.params[i].v = Some(v);
            // Biases are not decayed (the usual practice; decay pulls the heat-map bias
            // away from its prior).
            let decay = if name.ends_with(".bias") {
                0.0
            } else {
                options.weight_decay
            };
            steps.push(Step::AdamW {
                op: AdamW {
                    len: len as u32,
                    lr: 0.0,
                    beta1: options.beta1,
                    beta2: options.beta2,
                    eps: options.eps,
                    weight_decay: decay,
                    step: 1,
                },
                param: self.params[i].value,
                grad,
                m,
                v,
                hyper,
            });
            let ema = self
                .rec
                .f32(&StateTensor::Ema.name(&name), len, Role::State);
            self.params[i].ema = Some(ema);
            steps.push(Step::Ema {
                op: ops::Ema { len: len as u32 },
                param: self.params[i].value,
                ema,
                hyper,
            });
        }
        steps
    }

    /// A depthwise-separable block on `x` (`c_in × side × side`); returns its output and side.
    fn block(&mut self, name: &str, b: &SepBlock, x: TensorId, side: u32) -> (TensorId, u32) {
        let dw = Conv2d::depthwise(self.n, b.c_in, side, side, 3, b.stride, true);
        let d = self.conv(&format!("{name}.dw"), dw, x);
        let side = dw.out_h();
        let pw = Conv2d::pointwise(self.n, b.c_in, side, side, b.c_out, true);
        let p = self.conv(&format!("{name}.pw"), pw, d);
        if b.residual {
            (self.add(&format!("{name}.out"), p, x), side)
        } else {
            (p, side)
        }
    }
}

/// Gradient bookkeeping for the backward pass (see the module docs).
struct Grads {
    /// The gradient tensor of each activation that has one so far.
    of: HashMap<TensorId, TensorId>,
    /// How many activations' gradients are each gradient tensor.
    shared: HashMap<TensorId, u32>,
}

impl Grads {
    fn set(&mut self, t: TensorId, g: TensorId) {
        if let Some(old) = self.of.insert(t, g) {
            *self.shared.get_mut(&old).expect("tracked") -= 1;
        }
        *self.shared.entry(g).or_insert(0) += 1;
    }

    fn exclusive(&self, g: TensorId) -> bool {
        self.shared.get(&g).copied().unwrap_or(0) <= 1
    }

    /// Adds the contribution `c` to `t`'s gradient. `fresh`: `c` is a new tensor nothing
    /// else refers to (a backward kernel's output), so it may be added into in place.
    fn contribute(
        &mut self,
        t: TensorId,
        c: TensorId,
        fresh: bool,
        rec: &mut Recording,
    ) -> Option<Step> {
        let Some(&g) = self.of.get(&t) else {
            self.set(t, c);
            return None;
        };
        let op = ops::Add {
            len: rec.get(t).len as u32,
        };
        if fresh {
            self.set(t, c);
            return Some(Step::AddAssign { op, dst: c, src: g });
        }
        if self.exclusive(g) {
            return Some(Step::AddAssign { op, dst: g, src: c });
        }
        let name = format!("grad.{}.sum{}", rec.get(t).name, rec.tensors.len());
        let out = rec.f32(&name, op.len as usize, Role::Activation);
        self.set(t, out);
        Some(Step::Add {
            op,
            a: g,
            b: c,
            out,
        })
    }
}

/// Why a model's graph cannot be built for a batch of records.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error(
        "the dataset's records are {width}×{height}×{channels}; {model} takes {input}×{input}×3 \
         (pack with --size {input})"
    )]
    RecordSize {
        width: u32,
        height: u32,
        channels: u32,
        model: String,
        input: u32,
    },
    #[error("batch 0: a batch needs at least one record")]
    EmptyBatch,
    #[error(
        "batch {batch} is too large for {model} at {input}×{input}: {source}; the largest batch \
         that works is {best} (lower --batch)"
    )]
    BatchTooLarge {
        batch: u32,
        model: String,
        input: u32,
        best: u64,
        source: Box<GraphError>,
    },
    #[error(transparent)]
    Recording(#[from] crate::compute::recording::RecordingError),
}

impl ModelGraph {
    /// Builds the recording for `batch` records of `layout` (whose image must be the model's
    /// input size, 3 channels).
    ///
    /// A batch so large that a buffer would outgrow the kernels' `u32` indices (a typo such
    /// as `--batch 100000`) is refused naming the largest batch that builds.
    pub fn build(
        arch: &Arch,
        batch: u32,
        layout: &RecordLayout,
        options: &GraphOptions,
    ) -> Result<ModelGraph, GraphError> {
        Self::build_at(arch, batch, layout, options).map_err(|e| {
            // Graph sizes grow with the batch, so a binary search finds the largest that
            // builds; only when batch 1 does is the batch itself the problem.
            let builds = |b: u64| Self::build_at(arch, b as u32, layout, options).is_ok();
            match crate::base::largest_fitting(u64::from(batch.saturating_sub(1)), builds) {
                Some(best) => GraphError::BatchTooLarge {
                    batch,
                    model: arch.config.name.clone(),
                    input: arch.config.input,
                    best,
                    source: Box::new(e),
                },
                None => e,
            }
        })
    }

    fn build_at(
        arch: &Arch,
        batch: u32,
        layout: &RecordLayout,
        options: &GraphOptions,
    ) -> Result<ModelGraph, GraphError> {
        let config = &arch.config;
        if (layout.width, layout.height, layout.channels) != (config.input, config.input, 3) {
            return Err(GraphError::RecordSize {
                width: layout.width,
                height: layout.height,
                channels: layout.channels,
                model: config.name.clone(),
                input: config.input,
            });
        }
        if batch == 0 {
            return Err(GraphError::EmptyBatch);
        }
        let n = batch;
        let side = config.input;
        let grid = config.grid();
        let frozen_blocks = options.freeze.frozen_blocks(arch);
        let mut b = Builder {
            rec: Recording::new(),
            n,
            nodes: Vec::new(),
            forward: Vec::new(),
            params: Vec::new(),
            bias_of: HashMap::new(),
            // The stem stays with any frozen block.
            frozen: options.train && frozen_blocks > 0,
            train_biases: options.train && options.train_biases,
        };
        let record_stride = layout.record_size as u32;
        let records = b.rec.tensor(
            "records",
            n as usize * layout.record_size,
            Elem::Bytes,
            Role::Input,
        );
        let hyper = b.rec.f32("hyper", HYPER_LEN, Role::Input);
        let normalize = Normalize {
            n,
            h: side,
            w: side,
            record_stride,
            flip: false,
        };
        let x0 = b.rec.f32("input", normalize.output_len(), Role::Activation);
        let levels = config.output_levels();
        let targets_op = Targets {
            n,
            classes: config.classes,
            levels,
            max_boxes: layout.max_boxes,
            record_stride,
            meta_offset: layout.image_bytes as u32,
            min_overlap: 0.7,
            flip: false,
            neighbour_weight: options.neighbour_weight,
            neighbour_radius: options.neighbour_radius,
            neighbour_cells: options.neighbour_cells,
        };
        let targets = b
            .rec
            .f32("targets", targets_op.output_len(), Role::Activation);

        // Forward.
        let stem = Conv2d::dense(n, 3, side, side, arch.stem_out, 3, 2, true);
        let mut x = b.conv("stem", stem, x0);
        let mut s = stem.out_h();
        // Each block's output and side.
        let mut features = Vec::with_capacity(arch.blocks.len());
        for (i, block) in arch.blocks.iter().enumerate() {
            b.frozen = options.train && i < frozen_blocks;
            (x, s) = b.block(&format!("b{}", i + 1), block, x, s);
            features.push((x, s));
        }
        b.frozen = options.train && options.freeze.neck();
        let (p3, s3, coarse) = b.neck(arch, &features);
        debug_assert_eq!(s3, grid);

        b.frozen = false;
        let level_inputs = [(p3, s3)].into_iter().chain(coarse);
        let outputs: Vec<TensorId> = arch
            .heads()
            .into_iter()
            .zip(level_inputs)
            .map(|(name, (x, side))| b.head(&name, x, arch, side))
            .collect();
        let pred = if let [single] = outputs[..] {
            b.rec.tensors[single.index()].role = Role::Output;
            single
        } else {
            // The levels' outputs, gathered cell after cell into one output.
            let channels = config.out_channels();
            let total = levels.total_cells() as u32;
            let pred = b
                .rec
                .f32("pred", (n * channels * total) as usize, Role::Output);
            for (l, &out) in outputs.iter().enumerate() {
                let cells = levels.cells(l) as u32;
                let op = RowCopy::gather(
                    n * channels,
                    cells,
                    total,
                    levels.offset(l) as u32,
                    n * channels * total,
                );
                b.forward.push(Step::RowCopy {
                    op,
                    src: out,
                    dst: pred,
                });
                b.nodes.push(Node::Gather {
                    op,
                    x: out,
                    y: pred,
                });
            }
            pred
        };

        // The loss is the same sum at every cell: all levels as one row of cells.
        let loss_op = CenterLoss {
            giou_weight: options.giou_weight,
            ..if levels.len() == 1 {
                CenterLoss::det_s(n, config.classes, grid, grid)
            } else {
                CenterLoss::det_s(n, config.classes, 1, levels.total_cells() as u32)
            }
        };
        let loss = b.rec.f32("loss", LOSS_LEN, Role::Output);
        let decode = Decode {
            n,
            classes: config.classes,
            levels,
            threshold: options.threshold,
            top_k: options.top_k,
        };
        let dets = b.rec.tensor(
            "detections",
            decode.output_len() * crate::compute::recording::DETECTION_BYTES,
            Elem::Bytes,
            Role::Output,
        );
        let counts = b.rec.tensor(
            "detection_counts",
            4 * n as usize,
            Elem::Bytes,
            Role::Output,
        );

        // The targets first: the normalisation then comes right before the stem that reads
        // it, which an engine may run as one kernel (`compute::fusion::normalized_convs`).
        let prologue = |with_targets: bool| {
            let mut v = Vec::new();
            if with_targets {
                v.push(Step::Targets {
                    op: targets_op,
                    records,
                    out: targets,
                });
            }
            v.push(Step::Normalize {
                op: normalize,
                records,
                out: x0,
            });
            v
        };
        let loss_step = Step::LossForward {
            op: loss_op,
            pred,
            target: targets,
            loss,
        };

        let decode_step = Step::Decode {
            op: decode,
            pred,
            dets,
            counts,
        };
        let mut infer = prologue(false);
        infer.extend(b.forward.iter().cloned());
        infer.push(decode_step.clone());
        let mut eval = prologue(true);
        eval.extend(b.forward.iter().cloned());
        eval.push(loss_step.clone());
        eval.push(decode_step);

        let mut grad_norm = None;
        let train = if options.train {
            let mut train = prologue(true);
            train.extend(b.forward.iter().cloned());
            train.push(loss_step);
            let g_pred = b
                .rec
                .f32("grad.head.out", loss_op.pred_len(), Role::Activation);
            train.push(Step::LossBackward {
                op: loss_op,
                pred,
                target: targets,
                loss,
                grad: g_pred,
            });
            let normalize = prologue(false).remove(0);
            train.extend(backward(&mut b, pred, g_pred, normalize));
            if let Some(max_norm) = options.clip_norm {
                let (steps, sums) = clip_steps(&mut b, max_norm, hyper);
                train.extend(steps);
                grad_norm = Some(sums);
            }
            train.extend(b.optimizer_steps(options, hyper));
            Some(train)
        } else {
            None
        };

        let mut rec = b.rec;
        if let Some(train) = train {
            rec.entry(ENTRY_TRAIN, train);
        }
        rec.entry(ENTRY_EVAL, eval);
        rec.entry(ENTRY_INFER, infer);
        rec.validate()?;
        Ok(ModelGraph {
            arch: arch.clone(),
            batch,
            layout: *layout,
            recording: rec,
            records,
            hyper,
            loss,
            pred,
            dets,
            counts,
            grad_norm,
            params: b.params,
            decode,
        })
    }

    pub fn entry(&self, name: &str) -> usize {
        self.recording
            .find_entry(name)
            .unwrap_or_else(|| panic!("the model graph has no {name:?} entry"))
    }
}

/// Forward values the backward pass computes again where it needs them rather than keeping
/// them from the forward pass: the outputs of depthwise convolutions (9 multiply-adds per
/// value), of the stem (27 per value, on the largest tensor: 7 % of the forward work), of
/// upsampling (a copy) and the normalised input (from the records, which stay in their slot
/// for the whole step). Each is recomputed once, into a tensor that lives only
/// while the backward steps that read it run, so the forward tensor lives only until the
/// forward layer after it has read it (see `compute::storage`: the two then share memory
/// with other short-lived tensors). det-s at batch 32 (CPU engine) needs 35.5 MiB of
/// intermediate tensors instead of 61.
struct Recompute {
    /// The forward step that produces each recomputable tensor.
    producer: HashMap<TensorId, Step>,
    /// The recomputed copies made so far.
    copy: HashMap<TensorId, TensorId>,
}

impl Recompute {
    fn new(forward: &[Step], normalize: Step) -> Recompute {
        let Step::Normalize { out: x0, .. } = normalize else {
            unreachable!("the prologue normalises")
        };
        let mut producer = HashMap::new();
        for step in forward.iter().chain([&normalize]) {
            let y = match *step {
                Step::ConvForward { op, y, .. } if op.kind() == ops::ConvKind::Depthwise => y,
                // The stem: 3 input channels, and its output is the largest tensor.
                Step::ConvForward { x, y, .. } if x == x0 => y,
                Step::UpsampleForward { y, .. } => y,
                Step::Normalize { out, .. } => out,
                _ => continue,
            };
            producer.insert(y, step.clone());
        }
        Recompute {
            producer,
            copy: HashMap::new(),
        }
    }

    /// The tensor a backward step reads for the forward value `t`: `t` itself, or its
    /// recomputed copy, pushing the step that recomputes it the first time.
    fn read(&mut self, t: TensorId, rec: &mut Recording, steps: &mut Vec<Step>) -> TensorId {
        if let Some(&copy) = self.copy.get(&t) {
            return copy;
        }
        let Some(step) = self.producer.get(&t).cloned() else {
            return t;
        };
        // Its own input may be recomputed too (the stem's, from the records).
        let step = match step {
            Step::ConvForward { op, x, w, b, y } => Step::ConvForward {
                op,
                x: self.read(x, rec, steps),
                w,
                b,
                y,
            },
            Step::UpsampleForward { op, x, y } => Step::UpsampleForward {
                op,
                x: self.read(x, rec, steps),
                y,
            },
            other => other,
        };
        let tensor = rec.get(t);
        let copy = rec.f32(
            &format!("recompute.{}", tensor.name),
            tensor.len,
            Role::Activation,
        );
        steps.push(match step {
            Step::ConvForward { op, x, w, b, .. } => Step::ConvForward {
                op,
                x,
                w,
                b,
                y: copy,
            },
            Step::UpsampleForward { op, x, .. } => Step::UpsampleForward { op, x, y: copy },
            Step::Normalize { op, records, .. } => Step::Normalize {
                op,
                records,
                out: copy,
            },
            _ => unreachable!("only recomputable producers are kept"),
        });
        self.copy.insert(t, copy);
        copy
    }
}

/// The backward steps from the loss gradient `g_pred` of `pred` back to the first layer
/// (whose input `x0`, made by `normalize`, needs no gradient). Sets each parameter's `grad`.
/// Gradient-norm clipping's steps, after the backward pass and before the updates: every
/// parameter's sum of squares into one tensor, then the clip, which leaves the scale in
/// `hyper` for the optimizer steps. Returns the steps and that tensor.
fn clip_steps(b: &mut Builder, max_norm: f32, hyper: TensorId) -> (Vec<Step>, TensorId) {
    let trained: Vec<&ParamTensors> = b.params.iter().filter(|p| !p.frozen).collect();
    let op = ops::GradClip {
        tensors: trained.len() as u32,
        max_norm,
    };
    let sums = b.rec.f32("grad.norm", op.sums_len(), Role::Output);
    let mut steps: Vec<Step> = trained
        .iter()
        .enumerate()
        .map(|(slot, p)| {
            let x = p.grad.expect("every trained parameter has a gradient");
            Step::SumSquares {
                op: ops::SumSquares {
                    len: b.rec.get(x).len as u32,
                    slot: slot as u32,
                    tensors: op.tensors,
                },
                x,
                sums,
            }
        })
        .collect();
    steps.push(Step::ClipGrad { op, sums, hyper });
    (steps, sums)
}

/// The tensors whose gradient the backward pass needs: the outputs of trained convolutions
/// and everything computed from them.
fn needs_gradient(
    nodes: &[Node],
    params: &[ParamTensors],
    bias_of: &HashMap<usize, usize>,
) -> std::collections::HashSet<TensorId> {
    let mut needs = std::collections::HashSet::new();
    for node in nodes {
        let (inputs, out, trains) = match *node {
            Node::Conv { x, y, w, .. } => ([Some(x), None], y, conv_trains(params, bias_of, w)),
            Node::Add { a, b, out } => ([Some(a), Some(b)], out, false),
            Node::Upsample { x, y, .. } | Node::Gather { x, y, .. } => ([Some(x), None], y, false),
        };
        if trains || inputs.into_iter().flatten().any(|t| needs.contains(&t)) {
            needs.insert(out);
        }
    }
    needs
}

/// Whether the conv with weight `w` trains anything: its weight, or its bias alone
/// ([`GraphOptions::train_biases`]).
fn conv_trains(params: &[ParamTensors], bias_of: &HashMap<usize, usize>, w: usize) -> bool {
    !params[w].frozen || !params[bias_of[&w]].frozen
}

fn backward(b: &mut Builder, pred: TensorId, g_pred: TensorId, normalize: Step) -> Vec<Step> {
    let Step::Normalize { out: x0, .. } = normalize else {
        unreachable!("the prologue normalises")
    };
    let mut steps = Vec::new();
    let mut grads = Grads {
        of: HashMap::new(),
        shared: HashMap::new(),
    };
    let mut recompute = Recompute::new(&b.forward, normalize);
    let needs = needs_gradient(&b.nodes, &b.params, &b.bias_of);
    grads.set(pred, g_pred);
    for node in b.nodes.clone().into_iter().rev() {
        match node {
            // Frozen layers come first (backbone, then neck): nothing before one trains, so
            // the backward pass ends where they begin, unless their biases train.
            Node::Conv { w, .. } if !conv_trains(&b.params, &b.bias_of, w) => {}
            Node::Add { out: t, .. } | Node::Upsample { y: t, .. } | Node::Gather { y: t, .. }
                if !needs.contains(&t) => {}
            Node::Conv { op, x, w, y, .. } => {
                let gy = grads.of[&y];
                let forward_x = x;
                let x = recompute.read(x, &mut b.rec, &mut steps);
                let y = recompute.read(y, &mut b.rec, &mut steps);
                let wb = b.bias_of[&w];
                let gw = (!b.params[w].frozen).then(|| {
                    b.rec.f32(
                        &format!("grad.{}", b.params[w].name),
                        op.weight_len(),
                        Role::Activation,
                    )
                });
                let gb = b.rec.f32(
                    &format!("grad.{}", b.params[wb].name),
                    op.bias_len(),
                    Role::Activation,
                );
                b.params[w].grad = gw;
                b.params[wb].grad = Some(gb);
                let gx = (forward_x != x0 && needs.contains(&forward_x)).then(|| {
                    let name = format!(
                        "grad.{}.from{}",
                        b.rec.get(forward_x).name,
                        b.rec.tensors.len()
                    );
                    b.rec.f32(&name, op.input_len(), Role::Activation)
                });
                steps.push(Step::ConvBackward {
                    op,
                    x,
                    w: b.params[w].value,
                    y,
                    gy,
                    gx,
                    gw,
                    gb,
                });
                if let Some(gx) = gx {
                    steps.extend(grads.contribute(forward_x, gx, true, &mut b.rec));
                }
            }
            Node::Add { a, b: bb, out, .. } => {
                let g = grads.of[&out];
                for input in [a, bb].into_iter().filter(|t| needs.contains(t)) {
                    steps.extend(grads.contribute(input, g, false, &mut b.rec));
                }
            }
            Node::Upsample { op, x, y } => {
                let gy = grads.of[&y];
                let name = format!("grad.{}.from{}", b.rec.get(x).name, b.rec.tensors.len());
                let gx = b.rec.f32(&name, op.input_len(), Role::Activation);
                steps.push(Step::UpsampleBackward { op, gy, gx });
                steps.extend(grads.contribute(x, gx, true, &mut b.rec));
            }
            Node::Gather { op, x, y } => {
                // The level's cells of the output gradient, packed again.
                let gy = grads.of[&y];
                let name = format!("grad.{}.from{}", b.rec.get(x).name, b.rec.tensors.len());
                let gx = b.rec.f32(&name, op.src_len(), Role::Activation);
                let scatter = op.reversed();
                steps.push(Step::RowCopy {
                    op: scatter,
                    src: gy,
                    dst: gx,
                });
                steps.extend(grads.contribute(x, gx, true, &mut b.rec));
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::ModelConfig;

    fn graph(train: bool) -> ModelGraph {
        let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        let layout = RecordLayout::new(128, 128, 3, 32).unwrap();
        let options = GraphOptions {
            train,
            ..GraphOptions::default()
        };
        ModelGraph::build(&arch, 4, &layout, &options).unwrap()
    }

    #[test]
    fn det_s_graph_has_every_parameter_and_trains_each_once() {
        let g = graph(true);
        let params: usize = g.params.iter().map(|p| g.recording.get(p.value).len).sum();
        assert_eq!(params, 54_758);
        // The graph's parameters are the architecture's, in its order (checkpoints rely on it).
        let specs = g.arch.params();
        assert_eq!(specs.len(), g.params.len());
        for (spec, p) in specs.iter().zip(&g.params) {
            assert_eq!(
                (&spec.name, spec.len()),
                (&p.name, g.recording.get(p.value).len)
            );
        }
        let train = &g.recording.entries[g.entry(ENTRY_TRAIN)].steps;
        let adam = train
            .iter()
            .filter(|s| matches!(s, Step::AdamW { .. }))
            .count();
        assert_eq!(adam, g.params.len());
        // Each AdamW update is followed by the average of the tensor it updated.
        for (i, s) in train.iter().enumerate() {
            if let Step::AdamW { param, .. } = s {
                assert!(
                    matches!(train[i + 1], Step::Ema { param: p, .. } if p == *param),
                    "{:?}",
                    train[i + 1]
                );
            }
        }
        let convs = train
            .iter()
            .filter(|s| matches!(s, Step::ConvForward { .. }))
            .count();
        let backs = train
            .iter()
            .filter(|s| matches!(s, Step::ConvBackward { .. }))
            .count();
        assert_eq!((convs, backs), (19 + 9, 19));
        // The backward pass recomputes the eight depthwise outputs, the stem and the input,
        // and reads none of them, nor the upsampled neck (its gradient needs no values),
        // itself.
        let loss = train
            .iter()
            .position(|s| matches!(s, Step::LossForward { .. }))
            .unwrap();
        let x0 = train
            .iter()
            .find_map(|s| match s {
                Step::Normalize { out, .. } => Some(*out),
                _ => None,
            })
            .unwrap();
        let cheap: Vec<TensorId> = train[..loss]
            .iter()
            .filter_map(|s| match *s {
                Step::ConvForward { op, y, .. } if op.kind() == ops::ConvKind::Depthwise => Some(y),
                Step::ConvForward { x, y, .. } if x == x0 => Some(y),
                Step::UpsampleForward { y, .. } => Some(y),
                Step::Normalize { out, .. } => Some(out),
                _ => None,
            })
            .collect();
        assert_eq!(cheap.len(), 8 + 1 + 1 + 1);
        for s in &train[loss..] {
            assert!(!s.touches().iter().any(|t| cheap.contains(t)), "{s:?}");
        }
        let recomputed = train[loss..]
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    Step::ConvForward { .. }
                        | Step::UpsampleForward { .. }
                        | Step::Normalize { .. }
                )
            })
            .count();
        assert_eq!(recomputed, 10);
        // Exactly one conv backward (the stem) computes no input gradient.
        let no_gx = train
            .iter()
            .filter(|s| matches!(s, Step::ConvBackward { gx: None, .. }))
            .count();
        assert_eq!(no_gx, 1);
        // Every residual input gets two contributions: one add per residual (4 blocks + neck).
        let adds = train
            .iter()
            .filter(|s| matches!(s, Step::AddAssign { .. } | Step::Add { .. }))
            .count();
        assert_eq!(adds, 5 + 5, "5 forward adds and 5 gradient sums");
    }

    #[test]
    fn every_gradient_is_written_before_it_is_read() {
        for model in ["det-s", "det-m", "det-l"] {
            gradients_are_written_before_read(model);
        }
    }

    #[test]
    fn three_level_models_gather_their_heads_into_one_output() {
        let arch = Arch::new(&ModelConfig::named_at("det-m", 2, 160).unwrap());
        let layout = RecordLayout::new(160, 160, 3, 32).unwrap();
        let g = ModelGraph::build(&arch, 3, &layout, &GraphOptions::default()).unwrap();
        // 20×20 + 10×10 + 5×5 cells, K + 4 = 6 channels, batch 3.
        assert_eq!(g.recording.get(g.pred).len, 3 * 6 * 525);
        assert_eq!(g.decode.levels.total_cells(), 525);
        let copies = |entry: &str| -> Vec<RowCopy> {
            g.recording.entries[g.entry(entry)]
                .steps
                .iter()
                .filter_map(|s| match s {
                    Step::RowCopy { op, .. } => Some(*op),
                    _ => None,
                })
                .collect()
        };
        let gathers = copies(ENTRY_INFER);
        assert_eq!(
            gathers
                .iter()
                .map(|c| (c.len, c.dst_offset))
                .collect::<Vec<_>>(),
            [(400, 0), (100, 400), (25, 500)]
        );
        // Training gathers the three levels and scatters the gradient back to each.
        assert_eq!(copies(ENTRY_TRAIN).len(), 6);
        let heads = g
            .params
            .iter()
            .filter(|p| p.name.ends_with(".out.bias"))
            .count();
        assert_eq!(heads, 3);
    }

    fn gradients_are_written_before_read(model: &str) {
        let arch = Arch::new(&ModelConfig::named_at(model, 2, 128).unwrap());
        let layout = RecordLayout::new(128, 128, 3, 32).unwrap();
        let g = ModelGraph::build(&arch, 2, &layout, &GraphOptions::default()).unwrap();
        let train = &g.recording.entries[g.entry(ENTRY_TRAIN)].steps;
        let mut written = std::collections::HashSet::new();
        for t in [g.records, g.hyper] {
            written.insert(t);
        }
        for p in &g.params {
            for t in [Some(p.value), p.m, p.v, p.ema].into_iter().flatten() {
                written.insert(t);
            }
        }
        for (i, s) in train.iter().enumerate() {
            let (reads, writes): (Vec<TensorId>, Vec<TensorId>) = match s {
                Step::ConvForward { x, w, b, y, .. } => (vec![*x, *w, *b], vec![*y]),
                Step::ConvBackward {
                    x,
                    w,
                    y,
                    gy,
                    gx,
                    gw,
                    gb,
                    ..
                } => {
                    let mut wr = vec![*gb];
                    wr.extend(*gw);
                    wr.extend(*gx);
                    (vec![*x, *w, *y, *gy], wr)
                }
                Step::Add { a, b, out, .. } => (vec![*a, *b], vec![*out]),
                Step::AddAssign { dst, src, .. } => (vec![*dst, *src], vec![*dst]),
                Step::UpsampleForward { x, y, .. } => (vec![*x], vec![*y]),
                Step::UpsampleBackward { gy, gx, .. } => (vec![*gy], vec![*gx]),
                Step::RowCopy { src, dst, .. } => (vec![*src], vec![*dst]),
                Step::Normalize { records, out, .. } | Step::Targets { records, out, .. } => {
                    (vec![*records], vec![*out])
                }
                Step::LossForward {
                    pred, target, loss, ..
                } => (vec![*pred, *target], vec![*loss]),
                Step::LossBackward {
                    pred,
                    target,
                    loss,
                    grad,
                    ..
                } => (vec![*pred, *target, *loss], vec![*grad]),
                Step::AdamW {
                    param,
                    grad,
                    m,
                    v,
                    hyper,
                    ..
                } => (vec![*param, *grad, *m, *v, *hyper], vec![*param, *m, *v]),
                Step::Ema {
                    param, ema, hyper, ..
                } => (vec![*param, *ema, *hyper], vec![*ema]),
                other => panic!("unexpected step {other:?}"),
            };
            for r in reads {
                assert!(
                    written.contains(&r),
                    "{model}: step {i} ({}) reads {:?} before anything wrote it",
                    s.name(),
                    g.recording.get(r).name
                );
            }
            written.extend(writes);
        }
    }

    #[test]
    fn clipping_sums_every_gradient_between_the_backward_pass_and_the_updates() {
        assert!(graph(true).grad_norm.is_none(), "no clipping unless asked");
        let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        let layout = RecordLayout::new(128, 128, 3, 32).unwrap();
        let options = GraphOptions {
            clip_norm: Some(2.0),
            ..GraphOptions::default()
        };
        let g = ModelGraph::build(&arch, 4, &layout, &options).unwrap();
        let sums = g.grad_norm.expect("a clipped graph reports its norm");
        assert_eq!(g.recording.get(sums).len, 2 + g.params.len());
        let train = &g.recording.entries[g.entry(ENTRY_TRAIN)].steps;
        let first_update = train
            .iter()
            .position(|s| matches!(s, Step::AdamW { .. }))
            .unwrap();
        let clip = first_update - 1;
        assert!(matches!(
            train[clip],
            Step::ClipGrad { op, hyper, .. } if op.max_norm == 2.0 && hyper == g.hyper
        ));
        // One sum per parameter's gradient, each in its own slot, after every gradient is
        // written (nothing after the clip writes one).
        let summed: Vec<(TensorId, u32)> = train[clip - g.params.len()..clip]
            .iter()
            .map(|s| match s {
                Step::SumSquares { op, x, sums: t } if *t == sums => (*x, op.slot),
                other => panic!("{other:?}"),
            })
            .collect();
        for (slot, p) in g.params.iter().enumerate() {
            assert_eq!(summed[slot], (p.grad.unwrap(), slot as u32), "{}", p.name);
        }
        let grads: Vec<TensorId> = g.params.iter().map(|p| p.grad.unwrap()).collect();
        for s in &train[clip..] {
            for (t, written) in s.accesses() {
                assert!(!(written && grads.contains(&t)), "{s:?}");
            }
        }
    }

    #[test]
    fn inference_only_graph_has_no_training_state() {
        let g = graph(false);
        assert!(g.recording.find_entry(ENTRY_TRAIN).is_none());
        assert!(g.params.iter().all(|p| p.m.is_none() && p.grad.is_none()));
        assert!(g
            .recording
            .tensors
            .iter()
            .all(|t| t.role != Role::State && !t.name.starts_with("grad.")));
        assert!(g.recording.bytes() < graph(true).recording.bytes());
        let infer = &g.recording.entries[g.entry(ENTRY_INFER)].steps;
        assert!(matches!(infer.last(), Some(Step::Decode { .. })));
    }

    #[test]
    fn records_of_another_size_are_refused() {
        let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        let layout = RecordLayout::new(256, 256, 3, 32).unwrap();
        let e = ModelGraph::build(&arch, 4, &layout, &GraphOptions::default()).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("256×256×3") && e.contains("--size 128"), "{e}");
    }

    /// One training step of det-m on the CPU engine, every tensor kept: the graph and the
    /// engine afterwards.
    fn one_step(freeze: Freeze) -> (ModelGraph, crate::compute::cpu::exec::CpuExec) {
        one_step_with(freeze, false)
    }

    /// [`one_step`], the frozen layers' biases training where `train_biases`.
    fn one_step_with(
        freeze: Freeze,
        train_biases: bool,
    ) -> (ModelGraph, crate::compute::cpu::exec::CpuExec) {
        use crate::compute::cpu::targets::tests::records;
        let arch = Arch::new(&ModelConfig::named_at("det-m", 2, 128).unwrap());
        let layout = RecordLayout::new(128, 128, 3, 8).unwrap();
        let options = GraphOptions {
            freeze,
            train_biases,
            ..GraphOptions::default()
        };
        let g = ModelGraph::build(&arch, 2, &layout, &options).unwrap();
        let mut cpu = crate::compute::cpu::exec::CpuExec::separate(&g.recording, 2).unwrap();
        for (p, v) in g
            .params
            .iter()
            .zip(super::super::init::init_params(&arch, 3))
        {
            for t in [Some(p.value), p.ema].into_iter().flatten() {
                cpu.write_f32(t, &v).unwrap();
            }
        }
        // Boxes of every level's size, so that every head trains.
        let boxes: &[(u32, [f32; 4])] = &[
            (0, [10.0, 12.0, 30.0, 40.0]),
            (1, [40.0, 20.0, 110.0, 90.0]),
            (0, [4.0, 60.0, 124.0, 126.0]),
        ];
        let mut bytes = records(
            layout.image_bytes,
            layout.record_size,
            &[boxes, &boxes[..1]],
        );
        // Pictures of noise (a black one lights no ReLU and trains nothing).
        let mut rng = crate::base::SplitMix64::new(5);
        for record in bytes.chunks_exact_mut(layout.record_size) {
            for px in &mut record[..layout.image_bytes] {
                *px = (rng.next_u64() >> 56) as u8;
            }
        }
        cpu.write_bytes(g.records, &bytes).unwrap();
        let adam = AdamW {
            len: 1,
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 5e-4,
            step: 1,
        };
        cpu.write_f32(g.hyper, &adam.hyper()).unwrap();
        cpu.run(g.entry(ENTRY_TRAIN)).unwrap();
        (g, cpu)
    }

    #[test]
    fn frozen_layers_keep_their_weights_and_the_rest_gets_the_full_pass_gradients() {
        let read = |cpu: &mut crate::compute::cpu::exec::CpuExec, t: TensorId, len: usize| {
            let mut v = vec![0.0; len];
            cpu.read_f32(t, &mut v).unwrap();
            v
        };
        let (full, mut full_cpu) = one_step(Freeze::None);
        let init = super::super::init::init_params(&full.arch, 3);
        // det-m's stride-8 blocks end at b5.
        let early = &["stem", "b1.", "b2.", "b3.", "b4.", "b5."][..];
        for (freeze, biases, frozen_prefix) in [
            (Freeze::Early, false, early),
            (Freeze::Early, true, early),
            (Freeze::Backbone, false, &["stem", "b"][..]),
            (Freeze::BackboneNeck, false, &["stem", "b", "neck"][..]),
            (Freeze::Backbone, true, &["stem", "b"][..]),
            (Freeze::BackboneNeck, true, &["stem", "b", "neck"][..]),
        ] {
            let (g, mut cpu) = one_step_with(freeze, biases);
            let freeze = format!("{freeze}{}", if biases { " (biases train)" } else { "" });
            let train = &g.recording.entries[g.entry(ENTRY_TRAIN)].steps;
            let (mut frozen, mut trained, mut nonzero) = (0, 0, 0);
            for ((p, full_p), v0) in g.params.iter().zip(&full.params).zip(&init) {
                assert_eq!(p.name, full_p.name);
                let len = v0.len();
                let expected = frozen_prefix.iter().any(|f| p.name.starts_with(f))
                    && !(biases && p.name.ends_with(".bias"));
                assert_eq!(p.frozen, expected, "{freeze}: {}", p.name);
                if p.frozen {
                    frozen += 1;
                    assert!(p.grad.is_none() && p.m.is_none() && p.v.is_none() && p.ema.is_none());
                    // No weight gradient is summed for it at all.
                    let grad_name = format!("grad.{}", p.name);
                    assert!(!g.recording.tensors.iter().any(|t| t.name == grad_name));
                    assert!(!train
                        .iter()
                        .any(|s| matches!(s, Step::AdamW { param, .. } if *param == p.value)));
                    assert_eq!(
                        &read(&mut cpu, p.value, len),
                        v0,
                        "{freeze}: {} moved",
                        p.name
                    );
                } else {
                    trained += 1;
                    let got = read(&mut cpu, p.grad.unwrap(), len);
                    let want = read(&mut full_cpu, full_p.grad.unwrap(), len);
                    assert_eq!(got, want, "{freeze}: the gradient of {}", p.name);
                    nonzero += usize::from(got.iter().any(|&v| v != 0.0));
                }
            }
            assert!(
                frozen > 10 && trained > 10,
                "{freeze}: {frozen} frozen, {trained} trained"
            );
            // Equal, and not for being zero (a layer whose ReLUs are all off here may be).
            assert!(
                nonzero * 10 >= trained * 9,
                "{freeze}: {nonzero} of {trained}"
            );
            // The backward pass stops where the frozen layers begin: no gradient of a
            // frozen layer's activation is made, unless their biases train (then it runs to
            // the stem).
            let into_frozen = train.iter().any(|s| {
                matches!(s, Step::ConvBackward { gx: Some(gx), .. }
                if frozen_prefix.iter().any(|f| {
                    g.recording.get(*gx).name.starts_with(&format!("grad.{f}"))
                }))
            });
            assert_eq!(into_frozen, biases, "{freeze}");
        }
        // Training state only for the trained parameters: fewer and smaller tensors.
        let (g, _) = one_step(Freeze::BackboneNeck);
        let state = |g: &ModelGraph| {
            g.recording
                .tensors
                .iter()
                .filter(|t| t.role == Role::State)
                .map(|t| t.len)
                .sum::<usize>()
        };
        assert!(
            state(&g) * 2 < state(&full),
            "{} vs {}",
            state(&g),
            state(&full)
        );
    }
}
