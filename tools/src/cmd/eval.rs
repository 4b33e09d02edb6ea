use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fulcrum::infer::evaluate::{evaluate, full_image_baseline, EvalOptions, EvalReport};
use fulcrum::infer::nms::DEFAULT_NMS_IOU;
use fulcrum::io::DirectMode;
use fulcrum::loader::Dataset;
use fulcrum::model::Checkpoint;

use super::engine::EngineArgs;

/// Score a checkpoint on a packed dataset as COCO does: mAP@0.5 and mAP@[0.5:0.95], per class
/// and per object size, and the mean loss.
///
/// Every record is evaluated, in order, with its checksum verified; no augmentation. Use data
/// the model did not train on (`fulcrum pack SRC --holdout 0.2 --holdout-out VAL` makes such a
/// split). Object sizes are COCO's, by area on the source photo: small < 32² px, medium up to
/// 96² px, large above.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint (`fulcrum train` writes OUT/last.safetensors).
    #[arg(long, value_name = "CHECKPOINT")]
    weights: PathBuf,
    /// Packed dataset folder.
    #[arg(long)]
    data: PathBuf,
    /// Images per batch.
    #[arg(long, default_value_t = 16, value_parser = crate::args::count(crate::args::MAX_BATCH))]
    batch: u32,
    /// IoU a detection needs to count as a match for the mAP and AP columns (AP@[0.5:0.95]
    /// always averages 0.50, 0.55, …, 0.95).
    #[arg(long, default_value_t = 0.5, value_parser = crate::args::iou)]
    iou: f32,
    /// Of two detections of a class that overlap by an IoU above this, drop the lower-scored
    /// (a multi-level model can find one object at two levels); 1 keeps every detection.
    #[arg(long, value_name = "IOU", default_value_t = DEFAULT_NMS_IOU, value_parser = crate::args::nms_limit)]
    nms: f32,
    /// Also score the trivial baseline (one whole-image box per class and image) the same way.
    #[arg(long)]
    baseline: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Score class i of the model against class i of the data even where the data names
    /// classes the model does not know. Without it such data is refused: scores by position
    /// would be quietly wrong. (Where the model names every class of the data, in another
    /// order or among more, they are matched by name.)
    #[arg(long)]
    classes_by_position: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::output_file::check_some("--json", a.json.as_deref())?;
    let checkpoint = Checkpoint::load(&a.weights)?;
    // Buffered reads: evaluation reads into plain (unaligned) buffers, once per record.
    let dataset = Dataset::open(&a.data, DirectMode::Off)?;
    let data_classes = &dataset.manifest.classes;
    if !a.classes_by_position
        && !checkpoint.classes.is_empty()
        && checkpoint.classes.len() == data_classes.len()
        && &checkpoint.classes != data_classes
        // Where the checkpoint names every class of the data, they are matched by name.
        && !data_classes.iter().all(|c| checkpoint.classes.contains(c))
    {
        anyhow::bail!(
            "the classes differ: {} was trained on [{}], {} holds [{}]; evaluate on data \
             packed with the checkpoint's classes in its order, or pass --classes-by-position \
             to score class i against class i anyway",
            a.weights.display(),
            checkpoint.classes.join(", "),
            a.data.display(),
            data_classes.join(", ")
        );
    }
    let leaks = held_out_leaks(&checkpoint, &a.data, dataset.records());
    let options = EvalOptions {
        exec: a.engine.options(None),
        batch: a.batch,
        iou: a.iou,
        nms_iou: a.nms,
        ..EvalOptions::default()
    };
    let bar = crate::progress::bar(dataset.records(), "images");
    let report = evaluate(&checkpoint, &dataset, &options, &mut |done, _| {
        bar.set_position(done)
    })?;
    bar.finish_and_clear();
    crate::out!("{}", table(&report, a.iou));
    let baseline = if a.baseline {
        let b = full_image_baseline(&dataset, a.iou)?;
        crate::outln!(
            "baseline (one whole-image box per class and image): mAP@{} {:.3}, \
             mAP@[.5:.95] {:.3}",
            a.iou,
            b.map,
            b.map_50_95
        );
        Some(b)
    } else {
        None
    };
    if let Some(path) = &a.json {
        let json = serde_json::json!({
            "checkpoint": a.weights,
            "data": a.data,
            "images": report.images,
            "engine": report.engine,
            "iou": a.iou,
            "map": report.map.map,
            "map_50_95": report.map.map_50_95,
            "classes": report.classes,
            "ap": report.map.per_class,
            "ap_50_95": report.map.per_class_50_95,
            "truth": report.map.truth,
            "detections": report.map.detections,
            "sizes": report.map.per_size,
            "loss": report.loss,
            "seconds": report.wall.as_secs_f64(),
            "baseline_map": baseline.as_ref().map(|b| b.map),
            "baseline_map_50_95": baseline.as_ref().map(|b| b.map_50_95),
            "duplicates_of_training": leaks,
        });
        crate::output_file::write_json(path, &json)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// How many images of `data` duplicate images the checkpoint was trained on (the training
/// pack its header names), warning with the first few; `None` where that cannot be told.
fn held_out_leaks(checkpoint: &Checkpoint, data: &Path, records: u64) -> Option<usize> {
    use fulcrum::pack::duplicates::{leaks, Kind, Leaks};
    let trained_on = checkpoint.train.as_ref()?.get("data")?.as_str()?;
    let trained_on = Path::new(trained_on);
    if std::fs::canonicalize(trained_on).ok()? == std::fs::canonicalize(data).ok()? {
        log::warn!(
            "evaluating on the data the checkpoint was trained on ({}): the figures measure \
             memory, not detection; pack a held-out set with `fulcrum pack --holdout`",
            data.display()
        );
        return Some(records as usize);
    }
    match leaks(trained_on, data, records) {
        Ok(Leaks::Found(pairs)) if pairs.is_empty() => Some(0),
        Ok(Leaks::Found(pairs)) => {
            let shown: Vec<String> = pairs
                .iter()
                .take(5)
                .map(|(held_out, trained, kind)| match kind {
                    Kind::Exact => format!("{held_out} = {trained} (the same file)"),
                    Kind::Near => format!("{held_out} ≈ {trained} (the same picture saved again)"),
                })
                .collect();
            log::warn!(
                "{} of the {records} held-out images duplicate images the checkpoint was \
                 trained on ({}): {}{}; on those the figures measure memory, not detection. \
                 `fulcrum pack --holdout` keeps duplicates on one side of the split",
                pairs.len(),
                trained_on.display(),
                shown.join(", "),
                if pairs.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            );
            Some(pairs.len())
        }
        Ok(Leaks::Unknown) => {
            log::info!(
                "not checked whether held-out images duplicate training images: {} or {} has no \
                 picture hashes (packed before they were kept, or synthetic)",
                trained_on.display(),
                data.display()
            );
            None
        }
        Err(e) => {
            log::info!(
                "not checked whether held-out images duplicate training images: the training \
                 data the checkpoint names cannot be read here ({e})"
            );
            None
        }
    }
}

/// The per-class and per-size tables and the summary line.
pub fn table(r: &EvalReport, iou: f32) -> String {
    let ap = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
    let at = format!("AP@{iou}");
    let mut out = format!(
        "{:<20} {:>7} {:>8} {:>8} {:>11}\n",
        "class", "boxes", "found", at, "AP@[.5:.95]"
    );
    let m = &r.map;
    for (i, name) in r.classes.iter().enumerate() {
        out += &format!(
            "{:<20} {:>7} {:>8} {:>8} {:>11}\n",
            name,
            m.truth[i],
            m.detections[i],
            ap(m.per_class[i]),
            ap(m.per_class_50_95[i])
        );
    }
    out += &format!(
        "{:<20} {:>7} {:>8} {:>8} {:>11}\n",
        "size (source px)", "boxes", "", at, "AP@[.5:.95]"
    );
    for s in &m.per_size {
        out += &format!(
            "{:<20} {:>7} {:>8} {:>8} {:>11}\n",
            format!("{} {}", s.size.name(), s.size.describe()),
            s.truth,
            "",
            ap(s.map),
            ap(s.map_50_95)
        );
    }
    let loss = match r.loss {
        // The GIoU term is there only for models trained with one (`train --giou`).
        Some(l) if l[5] != 0.0 => format!(
            "loss {:.3} (focal {:.3}, offset {:.3}, size {:.3}, GIoU {:.3})",
            l[0], l[1], l[2], l[3], l[5]
        ),
        Some(l) => format!(
            "loss {:.3} (focal {:.3}, offset {:.3}, size {:.3})",
            l[0], l[1], l[2], l[3]
        ),
        None => format!(
            "no loss (fewer images than one batch of {}; a smaller --batch measures it)",
            r.batch
        ),
    };
    out += &format!(
        "mAP@{iou} {:.3}, mAP@[.5:.95] {:.3} over {} images; {loss}; {} in {:.1} s \
         ({:.0} images/s)\n",
        m.map,
        m.map_50_95,
        r.images,
        r.engine,
        r.wall.as_secs_f64(),
        r.images as f64 / r.wall.as_secs_f64().max(1e-9)
    );
    out
}
