//! Inference on images: decode, letterbox into a record, run the `infer` entry, and map the
//! detections back to the source image's pixels (undoing the letterbox).

use std::path::Path;
use std::time::{Duration, Instant};

use image::RgbImage;

use super::map::Scored;
use super::nms::{suppress_duplicates, DEFAULT_NMS_IOU};
use super::{Error, Result};
use crate::balance::MemoryPlan;
use crate::compute::cpu::decode::detections_from_bytes;
use crate::compute::exec::{Exec, ExecOptions};
use crate::compute::recording::DETECTION_BYTES;
use crate::format::{RecordLayout, RecordMeta};
use crate::model::Checkpoint;
use crate::model::ModelConfig;
use crate::model::{Arch, GraphOptions, ModelGraph, ENTRY_INFER};
use crate::pack::letterbox::decode_image;
use crate::pixels::{FramePass, Pixels, Rect};

/// A checkpoint set up for inference, one image at a time (the latency a robot sees).
pub struct Predictor {
    exec: Exec,
    graph: ModelGraph,
    layout: RecordLayout,
    record: Vec<u8>,
    dets: Vec<u8>,
    counts: [u8; 4],
    frames: FramePass,
    /// The CPU engine's threads, which the frame pass may split large frames over.
    pool: Option<std::sync::Arc<crate::compute::cpu::pool::Pool>>,
    /// Duplicate suppression's IoU limit (see [`super::nms`]).
    nms_iou: f32,
    pub classes: Vec<String>,
}

/// One image's detections, in source pixels, best first.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub detections: Vec<Scored>,
    /// Decode and letterbox on the host.
    pub prepare: Duration,
    /// The `infer` entry (normalise, forward, decode) on the engine.
    pub device: Duration,
}

/// Where the time of one [`Predictor::predict_into`] went.
#[derive(Debug, Clone, Copy, Default)]
pub struct PredictTiming {
    /// Letterboxing on the host.
    pub prepare: Duration,
    /// The `infer` entry (normalise, forward, decode) on the engine.
    pub device: Duration,
}

impl Predictor {
    /// What a predictor for `model` with `top_k` detections and sources up to `max_side`
    /// pixels allocates, item by item, computed without allocating any of it.
    pub fn plan(
        model: &ModelConfig,
        exec: &ExecOptions,
        top_k: u32,
        max_side: u32,
    ) -> Result<MemoryPlan> {
        let arch = Arch::new(model);
        let size = model.input;
        let layout = RecordLayout::new(size, size, 3, 1).map_err(Error::Config)?;
        let options = GraphOptions {
            train: false,
            top_k,
            ..GraphOptions::default()
        };
        let graph = ModelGraph::build(&arch, 1, &layout, &options).map_err(Error::Config)?;
        let mut plan = Exec::memory_plan(&graph.recording, exec)?;
        // The frame pass may split a frame over the CPU engine's threads, a scratch row each.
        let threads = exec.cpu_threads();
        plan.add("input record", 1, layout.record_size as u64);
        plan.add(
            "detections read back",
            1,
            u64::from(top_k) * DETECTION_BYTES as u64,
        );
        plan.add(
            format!("frame pass scratch (sources up to {max_side} px, {threads} bands)"),
            1,
            FramePass::planned_bytes(size, max_side, threads) as u64,
        );
        Ok(plan)
    }

    /// Sets up `checkpoint` on the engine `exec` chooses; detections below `threshold` are
    /// dropped, at most `top_k` kept, duplicates above [`DEFAULT_NMS_IOU`] suppressed (see
    /// [`Predictor::set_nms_iou`]).
    pub fn new(
        checkpoint: &Checkpoint,
        exec: &ExecOptions,
        threshold: f32,
        top_k: u32,
    ) -> Result<Self> {
        if !(0.0..=1.0).contains(&threshold) {
            return Err(Error::Config(format!(
                "threshold {threshold} must be in [0, 1]"
            )));
        }
        let arch = Arch::new(&checkpoint.model);
        let size = checkpoint.model.input;
        let layout = RecordLayout::new(size, size, 3, 1).map_err(Error::Config)?;
        let options = GraphOptions {
            train: false,
            threshold,
            top_k,
            ..GraphOptions::default()
        };
        let graph = ModelGraph::build(&arch, 1, &layout, &options).map_err(Error::Config)?;
        let mut exec = Exec::new(&graph.recording, exec)?;
        checkpoint.load_into(&mut exec, &graph, false)?;
        let pool = exec.cpu_pool();
        Ok(Predictor {
            exec,
            record: vec![0; layout.record_size],
            dets: vec![0; top_k as usize * DETECTION_BYTES],
            counts: [0; 4],
            frames: FramePass::new(size),
            pool,
            nms_iou: DEFAULT_NMS_IOU,
            graph,
            layout,
            classes: checkpoint.classes.clone(),
        })
    }

    /// Drops, of two detections of a class that overlap by an IoU above `limit`, the
    /// lower-scored (1 keeps every detection); a limit outside (0, 1] is refused.
    pub fn set_nms_iou(&mut self, limit: f32) -> Result<()> {
        super::nms::check_limit(limit).map_err(Error::Config)?;
        self.nms_iou = limit;
        Ok(())
    }

    pub fn engine(&self) -> String {
        self.exec.describe()
    }

    /// Whether the model runs on the Vulkan engine (else the CPU engine).
    pub fn is_vulkan(&self) -> bool {
        self.exec.is_vulkan()
    }

    /// Detections in an image file (JPEG, PNG; EXIF orientation applied).
    pub fn predict_file(&mut self, path: &Path) -> Result<(RgbImage, Prediction)> {
        let started = Instant::now();
        let image = decode_image(path)?;
        let mut p = self.predict(&image)?;
        p.prepare += started.elapsed() - p.prepare - p.device;
        Ok((image, p))
    }

    /// The model's input side, pixels.
    pub fn input_size(&self) -> u32 {
        self.layout.width
    }

    /// Most detections one image can give (the `top_k` it was built with).
    pub fn top_k(&self) -> usize {
        self.graph.decode.top_k as usize
    }

    /// Sizes the letterbox's scratch for sources up to `max_side` pixels a side, so that
    /// [`Predictor::predict_into`] on them allocates nothing.
    pub fn reserve_sources(&mut self, max_side: u32) {
        let threads = self.pool.as_ref().map_or(1, |p| p.threads());
        self.frames = FramePass::new(self.layout.width);
        self.frames.reserve(max_side, threads);
    }

    /// Bytes the predictor holds on the host for one image (record, detections, letterbox
    /// scratch), for memory plans.
    pub fn host_bytes(&self) -> usize {
        self.record.capacity() + self.dets.capacity() + self.frames.bytes()
    }

    /// Detections in `image`.
    pub fn predict(&mut self, image: &RgbImage) -> Result<Prediction> {
        let mut detections = Vec::with_capacity(self.top_k());
        let pixels = Pixels::rgb8(image)?;
        let timing = self.predict_into(&pixels, None, &mut detections)?;
        Ok(Prediction {
            detections,
            prepare: timing.prepare,
            device: timing.device,
        })
    }

    /// Detections in `crop` of `src` (all of it for `None`), in `src`'s pixels, best first,
    /// into `out` (cleared first). Allocates nothing once `out` holds [`Predictor::top_k`]
    /// and the letterbox scratch fits `src`.
    pub fn predict_into(
        &mut self,
        src: &Pixels<'_>,
        crop: Option<Rect>,
        out: &mut Vec<Scored>,
    ) -> Result<PredictTiming> {
        let started = Instant::now();
        let pixels = self.layout.image_bytes;
        let placed = self.frames.run_on(
            self.pool.as_deref(),
            src,
            crop,
            self.layout.image_mut(&mut self.record),
        )?;
        let region = crop.unwrap_or(Rect::whole(src.width(), src.height()));
        let meta = RecordMeta {
            source_width: region.width,
            source_height: region.height,
            scale: placed.scale,
            pad_x: placed.pad_x,
            pad_y: placed.pad_y,
            ..RecordMeta::default()
        };
        self.record[pixels..].fill(0);
        self.layout.write_meta(&mut self.record, &meta, &[]);
        let prepare = started.elapsed();
        self.exec.write_bytes(self.graph.records, &self.record)?;
        let timing = self.exec.run(self.graph.entry(ENTRY_INFER))?;
        self.exec.read_bytes(self.graph.dets, &mut self.dets)?;
        self.exec.read_bytes(self.graph.counts, &mut self.counts)?;
        out.clear();
        out.extend(
            detections_from_bytes(&self.graph.decode, 0, &self.dets, &self.counts)
                .map(|d| {
                    // Back to the crop's pixels, kept inside it, then to the frame's.
                    let unmap = |v: f32, pad: f32, max: u32, origin: u32| {
                        ((v - pad) / meta.scale).clamp(0.0, max as f32) + origin as f32
                    };
                    Scored {
                        class: d.class,
                        score: d.score,
                        x0: unmap(d.x0, meta.pad_x, meta.source_width, region.x),
                        y0: unmap(d.y0, meta.pad_y, meta.source_height, region.y),
                        x1: unmap(d.x1, meta.pad_x, meta.source_width, region.x),
                        y1: unmap(d.y1, meta.pad_y, meta.source_height, region.y),
                    }
                })
                .filter(Scored::has_area),
        );
        suppress_duplicates(out, self.nms_iou);
        Ok(PredictTiming {
            prepare,
            device: timing.device,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::exec::EngineChoice;
    use crate::infer::map::iou;

    /// A det-m whose every level predicts 96-pixel boxes at every cell of a near-flat heat map:
    /// the peaks of all three levels pile up on the same places. Each box's centre is
    /// `shift` cells of its level right of its cell.
    fn overlapping_model_shifted(shift: f32) -> Checkpoint {
        let model = ModelConfig::named("det-m", 1).unwrap();
        let mut checkpoint = Checkpoint::initial(model, vec!["thing".into()], 7);
        for (name, _, values) in &mut checkpoint.tensors {
            let stride = match name.as_str() {
                "head.out.bias" => 8.0f32,
                "head16.out.bias" => 16.0,
                "head32.out.bias" => 32.0,
                _ => continue,
            };
            // Channels: heat, x, y, w, h; the sizes are logarithms in cells of the level.
            values[1] += shift;
            values[3] = (96.0 / stride).ln();
            values[4] = (96.0 / stride).ln();
        }
        checkpoint
    }

    fn overlapping_model() -> Checkpoint {
        overlapping_model_shifted(0.0)
    }

    #[test]
    fn duplicates_across_levels_are_suppressed_unless_asked_not_to() {
        let exec = ExecOptions {
            engine: EngineChoice::Cpu,
            threads: 1,
            ..ExecOptions::default()
        };
        let checkpoint = overlapping_model();
        let mut predictor = Predictor::new(&checkpoint, &exec, 0.01, 100).unwrap();
        let image = RgbImage::from_pixel(256, 256, image::Rgb([90, 120, 60]));
        let mut all = Vec::new();
        predictor.set_nms_iou(1.0).unwrap();
        predictor
            .predict_into(&Pixels::rgb8(&image).unwrap(), None, &mut all)
            .unwrap();
        let mut kept = Vec::new();
        predictor.set_nms_iou(DEFAULT_NMS_IOU).unwrap();
        predictor
            .predict_into(&Pixels::rgb8(&image).unwrap(), None, &mut kept)
            .unwrap();

        let worst = |dets: &[Scored]| {
            let mut worst = 0.0f32;
            for (i, a) in dets.iter().enumerate() {
                for b in &dets[i + 1..] {
                    worst = worst.max(iou(a, b));
                }
            }
            worst
        };
        assert!(worst(&all) > 0.9, "the model should give duplicates");
        assert!(worst(&kept) <= DEFAULT_NMS_IOU);
        assert!(
            !kept.is_empty() && kept.len() < all.len() / 2,
            "{} of {}",
            kept.len(),
            all.len()
        );
        // The survivors are the best of the unsuppressed list, in its order.
        assert_eq!(kept[0], all[0]);
        let mut rest = all.iter();
        assert!(kept.iter().all(|k| rest.any(|a| a == k)));
        assert!(predictor.set_nms_iou(0.0).is_err());
    }

    #[test]
    fn boxes_wholly_outside_the_photo_are_dropped_not_clipped_to_lines() {
        let exec = ExecOptions {
            engine: EngineChoice::Cpu,
            threads: 1,
            ..ExecOptions::default()
        };
        let image = RgbImage::from_pixel(256, 192, image::Rgb([90, 120, 60]));
        let mut found = Vec::new();
        let mut predict = |checkpoint: &Checkpoint| {
            let mut predictor = Predictor::new(checkpoint, &exec, 0.01, 100).unwrap();
            predictor
                .predict_into(&Pixels::rgb8(&image).unwrap(), None, &mut found)
                .unwrap();
            found.clone()
        };
        let inside = predict(&overlapping_model());
        assert!(!inside.is_empty());
        assert!(inside.iter().all(Scored::has_area), "{inside:?}");
        // 50 cells to the right is at least 400 px: every box lies beyond the photo's right
        // edge, and clipping would make each one a line at x = 256.
        let outside = predict(&overlapping_model_shifted(50.0));
        assert!(outside.is_empty(), "{outside:?}");
    }
}
