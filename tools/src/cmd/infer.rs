use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use fulcrum::infer::nms::DEFAULT_NMS_IOU;
use fulcrum::infer::predict::Predictor;
use fulcrum::loader::preview::{class_colour, outline};
use fulcrum::model::Checkpoint;
use fulcrum::pack::source::is_image_path;
use image::Rgb;

use super::coco_results::CocoResults;
use super::engine::EngineArgs;

/// Detect objects in images: one JSON line per image on stdout.
///
/// Each line is `{"image": PATH, "width": W, "height": H, "detections": [{"class": NAME,
/// "class_id": K, "score": S, "box": [x0, y0, x1, y1]}, …], "ms": T}` with boxes in the
/// source image's pixels (the letterbox undone), best first. Inputs are image files (JPEG,
/// PNG) or folders of them. `--draw DIR` also writes each image with its boxes as a PNG;
/// `--coco FILE` writes every detection in COCO's results format, for pycocotools' COCOeval
/// and other standard scorers.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint (`fulcrum train` writes OUT/last.safetensors).
    #[arg(long, value_name = "CHECKPOINT")]
    weights: PathBuf,
    /// Image files or folders of images.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Lowest score reported [default: 0.3; 0.01 with --coco, as mAP integrates over every
    /// threshold].
    #[arg(long, value_parser = crate::args::probability)]
    threshold: Option<f32>,
    /// Most detections per image.
    #[arg(long, default_value_t = 100, value_parser = crate::args::count(10_000))]
    top_k: u32,
    /// Of two detections of a class that overlap by an IoU above this, drop the lower-scored
    /// (a multi-level model can find one object at two levels); 1 keeps every detection.
    #[arg(long, value_name = "IOU", default_value_t = DEFAULT_NMS_IOU, value_parser = crate::args::nms_limit)]
    nms: f32,
    /// Write each image with its detections outlined into this folder (PNG).
    #[arg(long, value_name = "DIR")]
    draw: Option<PathBuf>,
    /// Also write every detection into FILE in COCO's results format (`[{"image_id",
    /// "category_id", "bbox": [x, y, w, h], "score"}, …]`, source pixels).
    #[arg(long, value_name = "FILE")]
    coco: Option<PathBuf>,
    /// COCO annotations file the images are listed in: `--coco` takes image ids from it (by
    /// file name) and category ids (by class name). Without it, image ids are the numbers in
    /// the file names when all have one (COCO's 000000000009.jpg → 9), else positions in the
    /// input list from 1; category ids are class indices from 0.
    #[arg(long, value_name = "ANNOTATIONS", requires = "coco")]
    coco_ids: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
}

/// One image's JSON line, as `infer` and `client` print it: boxes to 0.1 px, scores to 1e-4.
pub fn json_line(
    image: &Path,
    (width, height): (u32, u32),
    classes: &[String],
    detections: impl Iterator<Item = (u32, f32, [f32; 4])>,
    time: Duration,
) -> serde_json::Value {
    let detections: Vec<_> = detections
        .map(|(class, score, bbox)| {
            // Rounded as f64: an f32 of 57.9 would print as 57.900001525878906.
            let bbox = bbox.map(|v| (f64::from(v) * 10.0).round() / 10.0);
            serde_json::json!({
                "class": classes.get(class as usize).cloned().unwrap_or_else(|| class.to_string()),
                "class_id": class,
                "score": (f64::from(score) * 1e4).round() / 1e4,
                "box": bbox,
            })
        })
        .collect();
    serde_json::json!({
        "image": image,
        "width": width,
        "height": height,
        "detections": detections,
        "ms": (time.as_secs_f64() * 1e4).round() / 10.0,
    })
}

/// The images named by `inputs` (folders expanded, sorted).
pub fn image_files(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(input)
                .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_image_path(p))
                .collect();
            if found.is_empty() {
                anyhow::bail!("{}: no JPEG or PNG images in this folder", input.display());
            }
            found.sort();
            files.extend(found);
        } else if input.exists() {
            files.push(input.clone());
        } else {
            anyhow::bail!("{}: no such file or folder", input.display());
        }
    }
    Ok(files)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::output_file::check_some("--coco", a.coco.as_deref())?;
    let checkpoint = Checkpoint::load(&a.weights)?;
    let files = image_files(&a.inputs)?;
    let threshold = a
        .threshold
        .unwrap_or(if a.coco.is_some() { 0.01 } else { 0.3 });
    let mut predictor = Predictor::new(&checkpoint, &a.engine.options(None), threshold, a.top_k)?;
    predictor
        .set_nms_iou(a.nms)
        .map_err(|e| anyhow::anyhow!("--nms: {e}"))?;
    let mut coco = match &a.coco {
        Some(_) => {
            let ids = match &a.coco_ids {
                Some(path) => Some((path.as_path(), fulcrum::pack::coco::read_ids(path)?)),
                None => None,
            };
            Some(CocoResults::new(&files, &predictor.classes, ids)?)
        }
        None => None,
    };
    if let Some(dir) = &a.draw {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    }
    log::info!("{} images on {}", files.len(), predictor.engine());
    let (mut device, mut failed) = (Duration::ZERO, 0);
    for (index, path) in files.iter().enumerate() {
        let (mut image, p) = match predictor.predict_file(path) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("{}", super::about_file(path, &e));
                failed += 1;
                continue;
            }
        };
        device += p.device;
        let line = json_line(
            path,
            (image.width(), image.height()),
            &predictor.classes,
            p.detections
                .iter()
                .map(|d| (d.class, d.score, [d.x0, d.y0, d.x1, d.y1])),
            p.prepare + p.device,
        );
        crate::outln!("{line}");
        if let Some(coco) = &mut coco {
            let boxes = p.detections.iter();
            coco.add(
                index,
                boxes.map(|d| (d.class, d.score, [d.x0, d.y0, d.x1, d.y1])),
            );
        }
        if let Some(dir) = &a.draw {
            draw(&mut image, &p.detections);
            let name = path.file_stem().unwrap_or_default().to_string_lossy();
            let out = dir.join(format!("{name}.png"));
            save_png(&image, &out)?;
        }
    }
    if let (Some(coco), Some(path)) = (&coco, &a.coco) {
        coco.write(path)?;
        log::info!("{} detections in COCO's results format", coco.detections());
    }
    log::info!(
        "{} images, {:.2} ms per image on the engine{}",
        files.len() - failed,
        device.as_secs_f64() * 1e3 / (files.len() - failed).max(1) as f64,
        if failed > 0 {
            format!("; {failed} could not be read")
        } else {
            String::new()
        }
    );
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn draw(image: &mut image::RgbImage, detections: &[fulcrum::infer::Scored]) {
    let (w, h) = image.dimensions();
    let thickness = (w.max(h) / 200).max(1);
    for d in detections {
        outline(
            image,
            (0, 0, w, h),
            [d.x0, d.y0, d.x1, d.y1],
            Rgb(class_colour(d.class)),
            thickness,
        );
    }
}

fn save_png(image: &image::RgbImage, out: &Path) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    image
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .map_err(|e| anyhow::anyhow!("{}: encoding PNG: {e}", out.display()))?;
    fulcrum::durable::write_atomic(out, &bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))
}
