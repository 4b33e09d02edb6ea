//! Evaluation: a checkpoint's detections on every record of a packed dataset, scored as
//! COCO scores them (mAP@0.5 and mAP@[0.5:0.95], per class and per object size; see
//! [`super::map`]), with the mean loss.
//!
//! Records are read straight from the shards (in order, every one, checksums verified: no
//! augmentation, no shuffling and no dropped remainder, unlike training's loader); the last
//! partial batch is padded with empty records whose detections are ignored.

use std::time::{Duration, Instant};

use super::map::{MapAccumulator, MapReport, Scored};
use super::nms::{suppress_duplicates, DEFAULT_NMS_IOU};
use super::{Error, Result};
use crate::compute::cpu::decode::detections_from_bytes;
use crate::compute::exec::{Exec, ExecOptions};
use crate::compute::recording::{DETECTION_BYTES, LOSS_LEN};
use crate::loader::{self, Dataset};
use crate::model::Checkpoint;
use crate::model::{Arch, GraphOptions, ModelGraph, ENTRY_EVAL};

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub exec: ExecOptions,
    pub batch: u32,
    /// IoU a detection needs to match a box (0.5: mAP@0.5).
    pub iou: f32,
    /// Lowest score decoded (low: mAP integrates over every threshold).
    pub threshold: f32,
    pub top_k: u32,
    /// Of two detections of a class overlapping by an IoU above this, the lower-scored is
    /// dropped (1: none is; see [`super::nms`]).
    pub nms_iou: f32,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            exec: ExecOptions::default(),
            batch: 16,
            iou: 0.5,
            threshold: 0.01,
            top_k: 100,
            nms_iou: DEFAULT_NMS_IOU,
        }
    }
}

/// What an evaluation measured.
#[derive(Debug, Clone)]
pub struct EvalReport {
    pub map: MapReport,
    pub classes: Vec<String>,
    pub images: u64,
    /// Mean of `[total, focal, offset, size, centres, giou]` over the full batches; `None` when the
    /// set is smaller than one batch (a padded batch's loss would count the padding).
    pub loss: Option<[f32; LOSS_LEN]>,
    /// The batch the loss is measured in.
    pub batch: u32,
    pub engine: String,
    pub wall: Duration,
}

/// Checks a record read straight from `dataset`'s shards (checksum, index, labels).
fn verify(dataset: &Dataset, record: &[u8], index: u64) -> Result<()> {
    let classes = dataset.manifest.num_classes();
    dataset
        .layout
        .verify(record, index, classes)
        .map_err(|problem| {
            loader::Error::Corrupt {
                path: dataset.dir.clone(),
                record: index,
                problem,
            }
            .into()
        })
}

/// A record's ground-truth boxes.
fn truth_boxes<'a>(
    layout: &'a crate::format::RecordLayout,
    record: &'a [u8],
) -> impl Iterator<Item = Scored> + 'a {
    (0..layout.box_count(record) as usize).map(|b| Scored::from(layout.read_box(record, b)))
}

/// `d` clipped to the letterboxed photo (the padding excluded), as `infer` clips its boxes to
/// the source image: eval then scores what a user of `infer` gets (pycocotools scoring
/// `infer --coco` agrees with it; see tools/scripts/coco-score.py).
fn within_content(d: Scored, meta: &crate::format::RecordMeta) -> Scored {
    let (x_end, y_end) = (
        meta.pad_x + meta.source_width as f32 * meta.scale,
        meta.pad_y + meta.source_height as f32 * meta.scale,
    );
    Scored {
        x0: d.x0.clamp(meta.pad_x, x_end),
        y0: d.y0.clamp(meta.pad_y, y_end),
        x1: d.x1.clamp(meta.pad_x, x_end),
        y1: d.y1.clamp(meta.pad_y, y_end),
        ..d
    }
}

/// How a checkpoint numbers the classes of the data it is evaluated on: where both name their
/// classes and the names differ, each data class by the checkpoint's class of the same name
/// (a model fine-tuned with replay knows more classes than either dataset); else by index.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassIds {
    /// The checkpoint's id of each data class.
    pub model_of_data: Vec<u32>,
    /// The data's id of each checkpoint class, `u32::MAX` for one the data lacks.
    pub data_of_model: Vec<u32>,
}

impl ClassIds {
    /// By name, where every data class is among the checkpoint's names and they differ.
    fn by_name(checkpoint: &Checkpoint, data: &[String]) -> Option<ClassIds> {
        let names = &checkpoint.classes;
        if names.is_empty() || names.as_slice() == data {
            return None;
        }
        let model_of_data = data
            .iter()
            .map(|c| names.iter().position(|n| n == c).map(|i| i as u32))
            .collect::<Option<Vec<u32>>>()?;
        let mut data_of_model = vec![u32::MAX; names.len()];
        for (d, &m) in model_of_data.iter().enumerate() {
            data_of_model[m as usize] = d as u32;
        }
        Some(ClassIds {
            model_of_data,
            data_of_model,
        })
    }
}

/// Checks that `checkpoint` can run on `dataset`'s records (the data's classes among the
/// checkpoint's, the same image size); returns how to number the classes where by name.
pub fn check_compatible(checkpoint: &Checkpoint, dataset: &Dataset) -> Result<Option<ClassIds>> {
    let data_classes = &dataset.manifest.classes;
    let by_name = ClassIds::by_name(checkpoint, data_classes);
    if by_name.is_none() && checkpoint.model.classes != dataset.manifest.num_classes() {
        return Err(Error::Config(format!(
            "the checkpoint's model has {} classes ({}); {} has {} ({}): evaluate on data \
             packed with the same classes",
            checkpoint.model.classes,
            checkpoint.classes.join(", "),
            dataset.dir.display(),
            data_classes.len(),
            data_classes.join(", ")
        )));
    }
    if by_name.is_none() && !checkpoint.classes.is_empty() && &checkpoint.classes != data_classes {
        log::warn!(
            "class names differ: checkpoint {:?}, data {:?} (compared by index)",
            checkpoint.classes,
            data_classes
        );
    }
    let size = checkpoint.model.input;
    if dataset.layout.width != size || dataset.layout.height != size {
        return Err(Error::Config(format!(
            "{} holds {}×{} images; the model takes {size}×{size}: pack with --size {size}",
            dataset.dir.display(),
            dataset.layout.width,
            dataset.layout.height
        )));
    }
    Ok(by_name)
}

/// Evaluates `checkpoint` on every record of `dataset` (opened with `DirectMode::Off`: the
/// reads go to plain buffers); `progress(done, total)` is called per batch.
pub fn evaluate(
    checkpoint: &Checkpoint,
    dataset: &Dataset,
    options: &EvalOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<EvalReport> {
    let class_ids = check_compatible(checkpoint, dataset)?;
    if let Some(ids) = &class_ids {
        log::info!(
            "the checkpoint knows {} classes, the data {}: scored on the data's, matched by name",
            ids.data_of_model.len(),
            ids.model_of_data.len()
        );
    }
    super::nms::check_limit(options.nms_iou)?;
    let started = Instant::now();
    let arch = Arch::new(&checkpoint.model);
    let graph_options = GraphOptions {
        train: false,
        threshold: options.threshold,
        top_k: options.top_k,
        giou_weight: checkpoint.giou_weight(),
        neighbour_weight: checkpoint.neighbour_weight(),
        neighbour_radius: checkpoint.neighbour_radius(),
        neighbour_cells: checkpoint.neighbour_cells(),
        ..GraphOptions::default()
    };
    let graph = ModelGraph::build(&arch, options.batch, &dataset.layout, &graph_options)?;
    let mut exec = Exec::new(&graph.recording, &options.exec)?;
    checkpoint.load_into(&mut exec, &graph, false)?;
    let entry = graph.entry(ENTRY_EVAL);

    let layout = &dataset.layout;
    let rs = layout.record_size;
    let batch = options.batch as usize;
    let total = dataset.records();
    let classes = dataset.manifest.num_classes();
    let mut records = vec![0u8; batch * rs];
    let mut dets = vec![0u8; batch * options.top_k as usize * DETECTION_BYTES];
    let mut counts = vec![0u8; 4 * batch];
    let mut loss = [0f32; LOSS_LEN];
    let (mut loss_sum, mut full_batches) = ([0f64; LOSS_LEN], 0u64);
    let mut acc = MapAccumulator::new(classes as usize, options.iou);
    let (mut found, mut truth) = (Vec::new(), Vec::new());
    let mut first = 0u64;
    while first < total {
        let n = (total - first).min(batch as u64) as usize;
        dataset
            .read_records(first, &mut records[..n * rs])
            .map_err(loader::Error::from)?;
        records[n * rs..].fill(0);
        for (i, record) in records[..n * rs].chunks_exact_mut(rs).enumerate() {
            verify(dataset, record, first + i as u64)?;
            if let Some(ids) = &class_ids {
                layout.map_classes(record, &ids.model_of_data);
            }
        }
        exec.write_bytes(graph.records, &records)?;
        exec.run(entry)?;
        exec.read_bytes(graph.dets, &mut dets)?;
        exec.read_bytes(graph.counts, &mut counts)?;
        if n == batch {
            exec.read_f32(graph.loss, &mut loss)?;
            for (s, l) in loss_sum.iter_mut().zip(loss) {
                *s += l as f64;
            }
            full_batches += 1;
        }
        for (i, record) in records[..n * rs].chunks_exact(rs).enumerate() {
            let meta = layout.read_meta(record);
            found.clear();
            // Scored in the data's class ids (a class the data lacks drops out).
            let data_class = |mut s: Scored| {
                if let Some(ids) = &class_ids {
                    s.class = ids.data_of_model[s.class as usize];
                }
                s
            };
            found.extend(
                detections_from_bytes(&graph.decode, i, &dets, &counts)
                    .map(|d| within_content(Scored::from(d), &meta))
                    .filter(Scored::has_area)
                    .map(data_class)
                    .filter(|s| s.class != u32::MAX),
            );
            suppress_duplicates(&mut found, options.nms_iou);
            truth.clear();
            truth.extend(truth_boxes(layout, record).map(data_class));
            acc.add_image(&found, &truth, meta.scale);
        }
        first += n as u64;
        progress(first, total);
    }
    let mean = (full_batches > 0).then(|| loss_sum.map(|s| (s / full_batches as f64) as f32));
    Ok(EvalReport {
        map: acc.finish(),
        classes: dataset.manifest.classes.clone(),
        images: total,
        loss: mean,
        batch: options.batch,
        engine: exec.describe(),
        wall: started.elapsed(),
    })
}

/// The trivial baseline, scored like [`evaluate`]: for every image, one box per class
/// covering the whole picture (the letterboxed content, padding excluded), score 1. A
/// detector worth its weights beats it clearly.
pub fn full_image_baseline(dataset: &Dataset, iou: f32) -> Result<MapReport> {
    let layout = &dataset.layout;
    let classes = dataset.manifest.num_classes();
    let mut acc = MapAccumulator::new(classes as usize, iou);
    let mut record = vec![0u8; layout.record_size];
    for index in 0..dataset.records() {
        dataset
            .read_records(index, &mut record)
            .map_err(loader::Error::from)?;
        verify(dataset, &record, index)?;
        let meta = layout.read_meta(&record);
        let (w, h) = (layout.width as f32, layout.height as f32);
        let guesses: Vec<Scored> = (0..classes)
            .map(|class| Scored {
                class,
                score: 1.0,
                x0: meta.pad_x,
                y0: meta.pad_y,
                x1: w - meta.pad_x,
                y1: h - meta.pad_y,
            })
            .collect();
        let truth: Vec<Scored> = truth_boxes(layout, &record).collect();
        acc.add_image(&guesses, &truth, meta.scale);
    }
    Ok(acc.finish())
}
