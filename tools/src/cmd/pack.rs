use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use fulcrum::pack::{self, PackOptions, Source};

/// Pack a dataset into checksummed shards (default: the built-in synthetic dataset).
///
/// Images are decoded once, letterboxed to --size × --size (grey padding) and written as
/// fixed-size records with their boxes. The same input and options always give byte-identical
/// shards. Formats: YOLO txt (flat images/ + labels/, or Ultralytics data.yaml splits), Pascal
/// VOC XML (annotations/ + images/), COCO JSON.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  fulcrum pack                                   # 2048 synthetic images into data/synthetic\n  fulcrum pack ../shared/data/coco128 --out data/coco128\n  fulcrum pack ../shared/data/raccoon --out data/raccoon --holdout 0.2 --holdout-out data/raccoon-val\n  fulcrum pack data.yaml --split val --out data/val"
)]
pub struct Args {
    /// Dataset folder (or data.yaml, or COCO .json). Leave out for the synthetic dataset.
    source: Option<PathBuf>,
    /// Generate N synthetic images (discs and squares on textured backgrounds) instead.
    #[arg(long, value_name = "N", conflicts_with = "source", value_parser = crate::args::count_u64(100_000_000))]
    synthetic: Option<u64>,
    /// Source format; auto detects it from the folder's contents.
    #[arg(long, default_value = "auto", value_parser = ["auto", "yolo", "voc", "coco"])]
    format: String,
    /// Split of an Ultralytics data.yaml dataset (train, val, test).
    #[arg(long, requires = "source", conflicts_with = "synthetic")]
    split: Option<String>,
    /// Image folder for a COCO .json (default: beside the .json, then images/).
    #[arg(long, requires = "source", conflicts_with = "synthetic")]
    images: Option<PathBuf>,
    /// Output dataset folder [default: data/synthetic for the synthetic set, else required].
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Model input size in pixels: images are letterboxed to SIZE × SIZE, and `train` builds
    /// the model at this size (a multiple of 32 from 128 to 640; larger sees smaller objects
    /// and costs about (SIZE/128)² the compute of 128).
    #[arg(long, default_value_t = 128, value_parser = crate::args::count(fulcrum::format::RecordLayout::MAX_SIDE))]
    size: u32,
    /// Most boxes kept per image (the largest win when there are more; pack warns and names
    /// the value that keeps them all). 100 (COCO's cap on detections per image) keeps the
    /// 30–90 boxes of crowd photos; a box costs 20 bytes of a record, usually nothing (records
    /// are padded to 4 KiB).
    #[arg(long, default_value_t = fulcrum::pack::DEFAULT_MAX_BOXES, value_parser = crate::args::count(fulcrum::format::RecordLayout::MAX_BOXES))]
    max_boxes: u32,
    /// Records per shard file.
    #[arg(long, default_value_t = 1024, value_parser = crate::args::count(1_000_000))]
    shard_records: u32,
    /// Packing threads, up to 256 [default (0): one per core].
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=256))]
    threads: usize,
    /// Seed of the synthetic dataset.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replace the output folder if it exists.
    #[arg(long)]
    force: bool,
    /// Hold out this fraction of the images (0 to 1) as a validation set, written to
    /// --holdout-out; --out gets the rest. The split is a fixed function of each image's file
    /// name and --holdout-seed.
    #[arg(long, value_name = "FRACTION", requires = "holdout_out", value_parser = crate::args::open_fraction)]
    holdout: Option<f64>,
    /// Where the held-out images go.
    #[arg(long, value_name = "DIR", requires = "holdout")]
    holdout_out: Option<PathBuf>,
    /// Seed of the hold-out split.
    #[arg(long, default_value_t = 0, value_name = "N", requires = "holdout")]
    holdout_seed: u64,
}

const DEFAULT_SYNTHETIC: u64 = 2048;

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let source = match (&a.source, a.synthetic) {
        (None, n) => Source::Synthetic {
            count: n.unwrap_or(DEFAULT_SYNTHETIC),
            seed: a.seed,
        },
        (Some(path), _) => match a.format.as_str() {
            "yolo" => Source::Yolo {
                dir: path.clone(),
                split: a.split.clone(),
            },
            "voc" => Source::Voc(path.clone()),
            "coco" => Source::Coco {
                json: path.clone(),
                images: a.images.clone(),
            },
            _ => match pack::detect(path)? {
                Source::Yolo { dir, .. } => Source::Yolo {
                    dir,
                    split: a.split.clone(),
                },
                Source::Coco { json, .. } => Source::Coco {
                    json,
                    images: a.images.clone(),
                },
                other => other,
            },
        },
    };
    let out = match (&a.out, &source) {
        (Some(out), _) => out.clone(),
        (None, Source::Synthetic { .. }) => PathBuf::from("data/synthetic"),
        (None, _) => anyhow::bail!(
            "--out DIR is required when packing a dataset (where should the shards go?)"
        ),
    };
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let trainable = fulcrum::model::ModelConfig::MIN_INPUT..=fulcrum::model::ModelConfig::MAX_INPUT;
    if !a.size.is_multiple_of(32) || !trainable.contains(&a.size) {
        log::warn!(
            "--size {}: no model trains at this size (a multiple of 32 from {} to {}); the pack \
             serves the loader and I/O tools only",
            a.size,
            trainable.start(),
            trainable.end()
        );
    }
    let options = PackOptions {
        size: a.size,
        max_boxes: a.max_boxes,
        records_per_shard: a.shard_records,
        threads: a.threads,
        force: a.force,
        ..PackOptions::new(source, &out)
    };
    match (a.holdout, &a.holdout_out) {
        (Some(fraction), Some(val_out)) => {
            let split = |take_held_out| fulcrum::pack::Holdout {
                fraction,
                seed: a.holdout_seed,
                take_held_out,
            };
            pack_one(&PackOptions {
                holdout: Some(split(false)),
                ..options.clone()
            })?;
            pack_one(&PackOptions {
                holdout: Some(split(true)),
                out: val_out.clone(),
                ..options
            })?;
        }
        _ => pack_one(&options)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn pack_one(options: &PackOptions) -> anyhow::Result<()> {
    let out = &options.out;
    let bar = crate::progress::bar(0, "packing");
    let started = std::time::Instant::now();
    let report = pack::pack(options, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let m = &report.manifest;
    let s = &m.summary;
    crate::outln!("packed {} → {}", s.source, out.display());
    crate::outln!(
        "  {} records ({} background) in {} shards, {}×{} RGB, {} classes, {:.1} MB, {:.1} s",
        m.records,
        s.background_images,
        m.shards.len(),
        m.width,
        m.height,
        m.classes.len(),
        (m.records * m.record_size as u64) as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    crate::outln!(
        "  boxes: {} kept, {} clipped to the image, {} dropped (too small), {} over --max-boxes {}",
        s.boxes,
        s.boxes_clipped,
        s.boxes_dropped,
        s.boxes_over_max,
        m.max_boxes
    );
    if let Some(sides) = s.box_sides.as_ref().filter(|b| b.boxes() > 0) {
        crate::outln!("  box sizes at {} px: {}", m.width, sides.describe());
    }
    if s.labels_without_image + s.rejected_labels + s.unreadable_images > 0 {
        crate::outln!(
            "  skipped: {} label files without an image, {} rejected label lines, {} images \
             unreadable or not JPEG/PNG (each named below)",
            s.labels_without_image,
            s.rejected_labels,
            s.unreadable_images
        );
    }
    if let Some(g) = &report.holdout_duplicates {
        crate::outln!(
            "  hold-out split: {} groups of duplicate pictures in the source ({} images: {} pairs \
             byte-identical, {} the same picture saved again, within {} bits of difference \
             hash), each kept on one side",
            g.groups.len(),
            g.images(),
            g.exact_pairs,
            g.near_pairs,
            fulcrum::pack::duplicates::NEAR_BITS
        );
    }
    if s.duplicate_groups > 0 {
        crate::outln!(
            "  duplicates inside this pack: {} groups, {} records (`fulcrum inspect` lists them)",
            s.duplicate_groups,
            s.duplicate_images
        );
    }
    for w in &report.warnings {
        log::warn!("{w}");
    }
    Ok(())
}
