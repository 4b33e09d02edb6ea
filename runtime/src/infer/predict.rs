//! Inference on images: decode, letterbox into a record, run the `infer` entry, and map the
//! detections back to the source image's pixels (undoing the letterbox).

use std::path::Path;
use std::time::{Duration, Instant};

use image::RgbImage;

use super::map::Scored;
use super::nms::{suppress_duplicates, DEFAULT_NMS_IOU};
use super::{Error, Result};
use crate::base::MemoryPlan;
use crate::compute::cpu::decode::detections_from_bytes;
use crate::compute::exec::{EngineChoice, Exec, ExecOptions, RunTiming};
use crate::compute::recording::DETECTION_BYTES;
use crate::compute::vulkan::{DeviceType, FrameJob};
use crate::format::{RecordLayout, RecordMeta};
use crate::model::Checkpoint;
use crate::model::ModelConfig;
use crate::model::{Arch, GraphOptions, ModelGraph, ENTRY_INFER};
use crate::pack::letterbox::decode_image;
use crate::pixels::{FramePass, GpuFramePlan, Pixels, Rect};

/// A checkpoint set up for inference, one image at a time (the latency a robot sees).
pub struct Predictor {
    exec: Exec,
    graph: ModelGraph,
    layout: RecordLayout,
    record: Vec<u8>,
    dets: Vec<u8>,
    counts: [u8; 4],
    frames: FramePass,
    /// The frame pass planned for the GPU, where it runs there ([`FramePlace::Gpu`]).
    gpu_frames: Option<GpuFramePlan>,
    /// The CPU engine's threads, which the frame pass may split large frames over.
    pool: Option<std::sync::Arc<crate::compute::cpu::pool::Pool>>,
    /// Duplicate suppression's IoU limit (see [`super::nms`]).
    nms_iou: f32,
    pub classes: Vec<String>,
}

/// Where a predictor's frame pass runs: on the host's cores (SIMD, split over the CPU engine's
/// threads where that pays), or on the Vulkan engine's device ahead of the forward pass, the
/// frame going there as it came. The default is the GPU where the model runs on one that is
/// not a CPU (on a CPU-type Vulkan device such as lavapipe the host pass is the faster of the
/// two on the same cores); [`FRAME_PASS_ENV`] overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramePlace {
    Cpu,
    Gpu,
}

/// `FULCRUM_FRAME_PASS=cpu|gpu|auto`: where the frame pass runs (see [`FramePlace`]).
pub const FRAME_PASS_ENV: &str = "FULCRUM_FRAME_PASS";

impl FramePlace {
    /// The place [`FRAME_PASS_ENV`] asks for, else the default for a model on `exec`.
    fn chosen(exec: &Exec) -> Result<FramePlace> {
        let default = match exec.vulkan_device_type() {
            Some(t) if t != DeviceType::Cpu => FramePlace::Gpu,
            _ => FramePlace::Cpu,
        };
        match std::env::var(FRAME_PASS_ENV).as_deref() {
            Err(_) | Ok("auto") | Ok("") => Ok(default),
            Ok("cpu") => Ok(FramePlace::Cpu),
            Ok("gpu") if exec.is_vulkan() => Ok(FramePlace::Gpu),
            Ok("gpu") => {
                log::info!("{FRAME_PASS_ENV}=gpu: the model runs on the CPU engine; frames too");
                Ok(FramePlace::Cpu)
            }
            Ok(other) => Err(Error::Config(format!(
                "{FRAME_PASS_ENV}={other:?}: use cpu, gpu or auto, or unset it"
            ))),
        }
    }
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
    /// The frame pass on the host, or with the pass on the GPU, planning its windows.
    pub prepare: Duration,
    /// The `infer` entry (normalise, forward, decode) on the engine.
    pub device: Duration,
    /// The frame pass's kernel on the GPU ([`FramePlace::Gpu`] on a queue with timestamps).
    pub frame_on_device: Option<Duration>,
}

impl PredictTiming {
    /// The frame pass, wherever it ran.
    pub fn frame_pass(&self) -> Duration {
        self.prepare + self.frame_on_device.unwrap_or_default()
    }
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
        let layout = RecordLayout::new(size, size, 3, 1)?;
        let options = GraphOptions {
            train: false,
            top_k,
            ..GraphOptions::default()
        };
        let graph = ModelGraph::build(&arch, 1, &layout, &options)?;
        // Resolved once: `auto` lists the devices (in a child process) to decide.
        let exec = &exec.resolved()?;
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
        if exec.engine == EngineChoice::Vulkan && GpuFramePlan::new(size).is_some() {
            // Where the pass may run on the GPU: its frame and window buffers (host-visible),
            // and the windows planned on the host.
            let words = GpuFramePlan::planned_words(size, max_side);
            plan.add(
                format!("frame pass on the GPU: frame buffer (frames up to {max_side} px)"),
                1,
                GpuFramePlan::planned_frame_bytes(max_side) as u64,
            );
            plan.add(
                "frame pass on the GPU: windows",
                1,
                (4 * words + GpuFramePlan::planned_bytes(size, max_side)) as u64,
            );
        }
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
        let layout = RecordLayout::new(size, size, 3, 1)?;
        let options = GraphOptions {
            train: false,
            threshold,
            top_k,
            ..GraphOptions::default()
        };
        let graph = ModelGraph::build(&arch, 1, &layout, &options)?;
        let mut exec = Exec::new(&graph.recording, exec)?;
        checkpoint.load_into(&mut exec, &graph, false)?;
        let pool = exec.cpu_pool();
        let gpu_frames = match FramePlace::chosen(&exec)? {
            FramePlace::Gpu => GpuFramePlan::new(size),
            FramePlace::Cpu => None,
        };
        Ok(Predictor {
            exec,
            record: vec![0; layout.record_size],
            dets: vec![0; top_k as usize * DETECTION_BYTES],
            counts: [0; 4],
            frames: FramePass::new(size),
            gpu_frames,
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
        super::nms::check_limit(limit)?;
        self.nms_iou = limit;
        Ok(())
    }

    pub fn engine(&self) -> String {
        self.exec.describe()
    }

    /// `plan` with the Vulkan driver's measured resident memory as a line of its own, where
    /// the model runs on Vulkan (see [`Exec::with_driver`]).
    pub fn with_driver(&self, plan: MemoryPlan) -> MemoryPlan {
        self.exec.with_driver(plan)
    }

    /// Whether the model runs on the Vulkan engine (else the CPU engine).
    pub fn is_vulkan(&self) -> bool {
        self.exec.is_vulkan()
    }

    /// Where the frame pass runs.
    pub fn frame_place(&self) -> FramePlace {
        if self.gpu_frames.is_some() {
            FramePlace::Gpu
        } else {
            FramePlace::Cpu
        }
    }

    /// Moves the frame pass to `place`: [`FramePlace::Gpu`] needs the Vulkan engine (and a
    /// model input that is a multiple of four pixels, as every model's is).
    pub fn set_frame_place(&mut self, place: FramePlace) -> Result<()> {
        self.gpu_frames =
            match place {
                FramePlace::Cpu => None,
                FramePlace::Gpu if !self.exec.is_vulkan() => return Err(Error::Config(
                    "the frame pass runs on the GPU only where the model does (--engine vulkan)"
                        .into(),
                )),
                FramePlace::Gpu => Some(GpuFramePlan::new(self.layout.width).ok_or_else(|| {
                    Error::Config(format!(
                        "the GPU frame pass writes {}-pixel inputs only in multiples of four",
                        self.layout.width
                    ))
                })?),
            };
        Ok(())
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
    pub fn reserve_sources(&mut self, max_side: u32) -> Result<()> {
        let threads = self.pool.as_ref().map_or(1, |p| p.threads());
        self.frames = FramePass::new(self.layout.width);
        self.frames.reserve(max_side, threads);
        if let Some(gpu) = &mut self.gpu_frames {
            gpu.reserve(max_side);
            self.exec.reserve_frames(
                self.graph.records,
                GpuFramePlan::planned_frame_bytes(max_side),
                GpuFramePlan::planned_words(self.layout.width, max_side),
            )?;
        }
        Ok(())
    }

    /// Bytes the predictor holds on the host for one image (record, detections, letterbox
    /// scratch, the GPU frame pass's plan and buffers), for memory plans.
    pub fn host_bytes(&self) -> usize {
        self.record.capacity()
            + self.dets.capacity()
            + self.frames.bytes()
            + self.gpu_frames.as_ref().map_or(0, GpuFramePlan::bytes)
            + self.exec.frame_bytes() as usize
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
        let on_gpu = match &mut self.gpu_frames {
            Some(gpu) => gpu.plan(src, crop)?,
            None => None,
        };
        let placed = match &on_gpu {
            Some(frame) => frame.placed,
            None => self.frames.run_on(
                self.pool.as_deref(),
                src,
                crop,
                self.layout.image_mut(&mut self.record),
            )?,
        };
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
        let entry = self.graph.entry(ENTRY_INFER);
        let (timing, frame_on_device) = match on_gpu {
            Some(frame) => {
                let job = FrameJob {
                    target: self.graph.records,
                    out_bytes: pixels,
                    frame: src.picture_bytes(),
                    windows: frame.windows,
                    push: frame.push,
                    groups: frame.groups,
                    tail: &self.record[pixels..],
                    tail_offset: pixels,
                };
                let t = self.exec.run_frame(&job, Some(entry))?;
                let entry = t.entry.map(RunTiming::from).unwrap_or_default();
                (entry, t.frame_gpu)
            }
            None => {
                self.exec.write_bytes(self.graph.records, &self.record)?;
                (self.exec.run(entry)?, None)
            }
        };
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
            frame_on_device,
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

    /// The GPU frame pass (Vulkan engine) writes the record the CPU pass would, within a level
    /// of 255, with the same metadata, and the model finds the same things in it.
    #[test]
    fn frames_passed_on_the_gpu_reach_the_model_as_on_the_cpu() {
        use crate::pixels::{ColourSpace, PixelFormat};
        if crate::compute::vulkan::testing::engine("frames_passed_on_the_gpu").is_none() {
            return;
        }
        let exec = ExecOptions {
            engine: EngineChoice::Vulkan,
            validation: true,
            ..ExecOptions::default()
        };
        let model = ModelConfig::named("det-s", 1).unwrap();
        let checkpoint = Checkpoint::initial(model, vec!["thing".into()], 7);
        let (w, h) = (320u32, 240u32);
        // Smooth NV12 content: a luma ramp with a bright square, chroma ramps.
        let mut frame = vec![0u8; (w * h * 3 / 2) as usize];
        for y in 0..h as usize {
            for x in 0..w as usize {
                let square = (100..180).contains(&x) && (60..140).contains(&y);
                frame[y * w as usize + x] = if square { 230 } else { (x / 2 + y / 3) as u8 };
            }
        }
        for (i, v) in frame[(w * h) as usize..].iter_mut().enumerate() {
            *v = (64 + i % 128) as u8;
        }
        let pixels = Pixels::new(
            PixelFormat::Nv12,
            w,
            h,
            0,
            ColourSpace::Bt601Limited,
            &frame,
        )
        .unwrap();
        let crop = Some(Rect {
            x: 17,
            y: 9,
            width: 250,
            height: 200,
        });
        let run = |place| {
            let mut p = Predictor::new(&checkpoint, &exec, 0.0, 20).unwrap();
            p.set_frame_place(place).unwrap();
            assert_eq!(p.frame_place(), place);
            p.reserve_sources(w).unwrap();
            let mut found = Vec::new();
            p.predict_into(&pixels, crop, &mut found).unwrap();
            let mut record = vec![0u8; p.layout.image_bytes + p.layout.meta_bytes];
            p.exec.read_bytes(p.graph.records, &mut record).unwrap();
            (found, record, p.layout.image_bytes)
        };
        let (on_gpu, gpu_record, image) = run(FramePlace::Gpu);
        let (on_cpu, cpu_record, _) = run(FramePlace::Cpu);
        let worst = gpu_record[..image]
            .iter()
            .zip(&cpu_record[..image])
            .map(|(a, b)| a.abs_diff(*b))
            .max();
        assert!(worst <= Some(1), "image bytes differ by {worst:?}");
        assert!(
            gpu_record[..image].iter().any(|&v| v > 200),
            "the square is in the image"
        );
        // The metadata after the checksum (a record's checksum guards records on disk; the
        // GPU pass's host copy has no image to sum, and inference reads no checksum).
        assert_eq!(gpu_record[image + 4..], cpu_record[image + 4..], "metadata");
        assert_eq!(on_gpu.len(), on_cpu.len());
        assert!(!on_gpu.is_empty());
        assert!(
            iou(&on_gpu[0], &on_cpu[0]) > 0.9 && (on_gpu[0].score - on_cpu[0].score).abs() < 0.02,
            "{:?} against {:?}",
            on_gpu[0],
            on_cpu[0]
        );

        let cpu_engine = ExecOptions {
            engine: EngineChoice::Cpu,
            threads: 1,
            ..ExecOptions::default()
        };
        let mut p = Predictor::new(&checkpoint, &cpu_engine, 0.0, 20).unwrap();
        assert_eq!(p.frame_place(), FramePlace::Cpu);
        let refused = p.set_frame_place(FramePlace::Gpu).unwrap_err().to_string();
        assert!(refused.contains("--engine vulkan"), "{refused}");
    }
}
