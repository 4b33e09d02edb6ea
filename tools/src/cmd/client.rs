//! `fulcrum client`: images to a running `fulcrumd`, detections back as JSON lines.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use fulcrum::pack::letterbox::decode_image;
use fulcrum::serve::client::Client;
use fulcrum::serve::frame::encode_frame;
use fulcrum_board::protocol::{
    Crop, FineTuneFreeze, FineTuneParams, FineTuneState, FineTuneStatus, FrameDesc, FrameSource,
    PixelFormat,
};

use super::infer::{image_files, json_line};

/// Send images to a running fulcrumd and print its detections: the same JSON lines as
/// `fulcrum infer` prints for the same weights and images.
///
/// Each image is decoded here and sent as a camera frame in `--format` (converted the way a
/// camera's ISP would), inline when it fits in one message and otherwise through a memfd ring
/// the client shares with the daemon (`--ring` always uses the ring). "ms" is the round trip.
#[derive(clap::Args)]
pub struct Args {
    /// The daemon's socket [default: $RUNTIME_DIRECTORY/fulcrumd.sock, else
    /// /run/fulcrumd/fulcrumd.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Image files or folders of images.
    #[arg(required_unless_present_any = ["stats", "fine_tune", "fine_tune_status", "fine_tune_stop"])]
    inputs: Vec<PathBuf>,
    /// Pixel format to send: rgb8, bgr8, rgba8, bgra8, gray8, yuyv or nv12 (YUV needs even
    /// sides: an odd last column or row is cut).
    #[arg(long, default_value = "rgb8", value_parser = parse_format)]
    format: PixelFormat,
    /// Look only at this rectangle of each image: X,Y,W,H in image pixels (the daemon
    /// letterboxes the crop alone; boxes still come back in image pixels).
    #[arg(long, value_name = "X,Y,W,H", value_parser = parse_crop)]
    crop: Option<Crop>,
    /// Send every frame through the memfd ring, even small ones.
    #[arg(long)]
    ring: bool,
    /// Lowest score returned [default: the daemon's].
    #[arg(long, value_parser = crate::args::probability)]
    threshold: Option<f32>,
    /// Print the daemon's counters and latency as one JSON line at the end.
    #[arg(long)]
    stats: bool,
    /// Start fine-tuning the served weights on DATA, a folder with two packed datasets:
    /// DATA/train (trained on) and DATA/val (held out: new weights are swapped in only when
    /// they score better there). Pack them with `fulcrum pack SOURCE --out DATA/train
    /// --holdout 0.2 --holdout-out DATA/val`. The daemon must be able to read DATA.
    #[arg(long, value_name = "DATA")]
    fine_tune: Option<PathBuf>,
    /// Fine-tuning epochs over DATA/train [default: the daemon's, 5].
    #[arg(long, requires = "fine_tune", value_parser = clap::value_parser!(u16).range(1..))]
    epochs: Option<u16>,
    /// Stop fine-tuning after this many steps.
    #[arg(long, requires = "fine_tune", value_parser = clap::value_parser!(u32).range(1..))]
    max_steps: Option<u32>,
    /// Swap the fine-tuned weights in at the end even if they do not score better.
    #[arg(long, requires = "fine_tune")]
    swap_always: bool,
    /// Layers the fine-tune leaves as they are: auto (the daemon chooses from its memory
    /// budget), none, early, backbone or backbone+neck (see `fulcrum train --freeze`).
    #[arg(long, requires = "fine_tune", default_value = "auto", value_parser = freeze, value_name = "LAYERS")]
    freeze: FineTuneFreeze,
    /// With --freeze early, backbone or backbone+neck: the frozen layers' biases train too (see
    /// `fulcrum train --train-biases`).
    #[arg(long, requires = "fine_tune")]
    train_biases: bool,
    /// Follow the fine-tune until it ends, a progress line every 2 s.
    #[arg(long)]
    wait: bool,
    /// Print the fine-tune's state as one JSON line.
    #[arg(long)]
    fine_tune_status: bool,
    /// Stop the running fine-tune (it checkpoints first; the best weights stay swapped in).
    #[arg(long)]
    fine_tune_stop: bool,
}

pub fn parse_format(text: &str) -> Result<PixelFormat, String> {
    PixelFormat::ALL
        .into_iter()
        .find(|f| f.name().eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            format!("unknown pixel format {text:?}: rgb8, bgr8, rgba8, bgra8, gray8, yuyv or nv12")
        })
}

/// `X,Y,W,H`: a rectangle of positive area, in pixels.
pub fn parse_crop(text: &str) -> Result<Crop, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let bad = || format!("--crop {text:?}: expected X,Y,W,H in pixels, e.g. 320,0,320,240");
    let [x, y, w, h] = parts[..] else {
        return Err(bad());
    };
    let n = |v: &str| v.parse::<u16>().map_err(|_| bad());
    let crop = Crop {
        x: n(x)?,
        y: n(y)?,
        width: n(w)?,
        height: n(h)?,
    };
    if crop.width == 0 || crop.height == 0 {
        return Err(format!(
            "--crop {text:?}: the width and height must be at least 1"
        ));
    }
    Ok(crop)
}

pub fn default_socket() -> PathBuf {
    std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|v| v.to_string_lossy().split(':').next().map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/run/fulcrumd"))
        .join("fulcrumd.sock")
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(t) = a.threshold {
        if !(t > 0.0 && t <= 1.0) {
            anyhow::bail!("--threshold {t} must be in (0, 1]");
        }
    }
    let socket = a.socket.clone().unwrap_or_else(default_socket);
    let mut client = Client::connect(&socket)?;
    if fine_tune(&a, &mut client)? && a.inputs.is_empty() && !a.stats {
        return Ok(ExitCode::SUCCESS);
    }
    let files = image_files(&a.inputs)?;
    let mut classes = client.classes()?;
    let mut welcome = *client.welcome();
    log::info!(
        "{} images to {} ({} engine, model input {}x{}, weights generation {})",
        files.len(),
        socket.display(),
        welcome.engine.name(),
        welcome.input_width,
        welcome.input_height,
        welcome.weights_generation
    );
    let mut failed = 0;
    let mut frame = Vec::new();
    for (i, path) in files.iter().enumerate() {
        let image = match decode_image(path) {
            Ok(image) => image,
            Err(e) => {
                log::warn!("{}", super::about_file(path, &e));
                failed += 1;
                continue;
            }
        };
        let subsampled = matches!(a.format, PixelFormat::Yuyv | PixelFormat::Nv12);
        let even = |v: u32| if subsampled { v & !1 } else { v };
        let (w, h) = (even(image.width()), even(image.height()));
        let (Ok(w16), Ok(h16)) = (u16::try_from(w), u16::try_from(h)) else {
            log::warn!("{}: {w}x{h} is larger than any frame", path.display());
            failed += 1;
            continue;
        };
        let cropped = image::imageops::crop_imm(&image, 0, 0, w, h).to_image();
        let mut desc = match FrameDesc::packed(a.format, FrameSource::Inline, w16, h16) {
            Ok(d) => d,
            Err(e) => {
                log::warn!("{}: {w}x{h} as {}: {e}", path.display(), a.format.name());
                failed += 1;
                continue;
            }
        };
        desc.min_score = a.threshold.unwrap_or(0.0);
        if let Some(crop) = a.crop {
            if crop.check(w16, h16).is_err() {
                log::warn!(
                    "{}: --crop {},{},{},{} reaches outside the {w}x{h} image",
                    path.display(),
                    crop.x,
                    crop.y,
                    crop.width,
                    crop.height
                );
                failed += 1;
                continue;
            }
            desc.crop = crop;
        }
        frame.resize(desc.length as usize, 0);
        encode_frame(cropped.as_raw(), w16, h16, a.format, 0, &mut frame);
        let started = Instant::now();
        let result = if a.ring || desc.length > welcome.max_inline_bytes {
            let need = u64::from(desc.length);
            client
                .attach_ring_for(need)
                .and_then(|()| client.write_ring(0, &frame))
                .and_then(|()| client.infer_ring(desc, i as u64))
        } else {
            client.infer_inline(desc, &frame, i as u64)
        };
        let reply = match result {
            Ok(r) => r,
            Err(e) => {
                log::warn!("{}", super::about_file(path, &e));
                failed += 1;
                continue;
            }
        };
        if reply.weights_generation != welcome.weights_generation {
            // Reloaded weights answered: their classes may be others.
            welcome = *client.refresh()?;
            classes = client.classes()?;
            log::warn!(
                "the daemon reloaded its weights (generation {}): model input {}x{}, classes \
                 now {}",
                welcome.weights_generation,
                welcome.input_width,
                welcome.input_height,
                classes.join(", ")
            );
        }
        let line = json_line(
            path,
            (w, h),
            &classes,
            reply
                .boxes
                .iter()
                .map(|d| (u32::from(d.class), d.score, [d.x0, d.y0, d.x1, d.y1])),
            started.elapsed(),
        );
        crate::outln!("{line}");
    }
    if a.stats {
        let s = client.stats()?;
        crate::outln!(
            "{}",
            serde_json::json!({
                "requests": s.requests, "errors": s.errors, "refused": s.refused,
                "clients": s.clients, "p50_us": s.p50_us, "p99_us": s.p99_us,
                "p999_us": s.p999_us, "forward_us": s.forward_us, "uptime_s": s.uptime_s,
                "weights_generation": s.weights_generation,
            })
        );
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub fn freeze(s: &str) -> Result<FineTuneFreeze, fulcrum::base::UnknownChoice> {
    FineTuneFreeze::ALL
        .into_iter()
        .find(|f| f.name() == s)
        .ok_or_else(|| {
            fulcrum::base::UnknownChoice::new(
                "--freeze",
                s,
                "auto, none, early, backbone or backbone+neck",
            )
        })
}

/// The fine-tune options; whether there were any.
fn fine_tune(a: &Args, client: &mut Client) -> anyhow::Result<bool> {
    if let Some(data) = &a.fine_tune {
        // The daemon resolves the path from its own working folder, not ours.
        let data = std::path::absolute(data)?;
        let text = data
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("{}: not UTF-8", data.display()))?;
        let params = FineTuneParams {
            max_steps: a.max_steps.unwrap_or(0),
            epochs: a.epochs.unwrap_or(0),
            swap_always: a.swap_always,
            freeze: a.freeze,
            train_biases: a.train_biases,
        };
        client.fine_tune_start(text, params)?;
        log::info!("fine-tune started on {}", data.display());
    }
    if a.fine_tune_stop {
        client.fine_tune_stop()?;
        log::info!("fine-tune stopping (it checkpoints first)");
    }
    let asked = a.fine_tune.is_some() || a.fine_tune_stop || a.fine_tune_status || a.wait;
    if a.wait {
        loop {
            let s = client.fine_tune_status()?;
            let done = !matches!(s.state, FineTuneState::Running | FineTuneState::Stopping);
            if done {
                break;
            }
            if s.total_steps == 0 {
                log::info!(
                    "fine-tune preparing: scoring the served weights on the held-out set, sizing the batch"
                );
                std::thread::sleep(std::time::Duration::from_secs(2));
                continue;
            }
            log::info!(
                "fine-tune {}: epoch {}, step {}/{}, loss {:.3}, held-out mAP {:.3} served / {:.3} latest, {} swap(s); {}",
                s.state.name(),
                s.epoch,
                s.step,
                s.total_steps,
                s.loss,
                s.serving_map,
                s.candidate_map,
                s.swaps,
                balance_line(&s)
            );
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
    }
    if a.fine_tune_status || a.wait {
        let s = client.fine_tune_status()?;
        crate::outln!(
            "{}",
            serde_json::json!({
                "state": s.state.name(), "epoch": s.epoch, "step": s.step,
                "total_steps": s.total_steps, "loss": s.loss, "serving_map": s.serving_map,
                "candidate_map": s.candidate_map, "swaps": s.swaps,
                "load_per_batch_us": s.load_per_batch_us, "step_us": s.step_us,
                "balance": balance_line(&s),
            })
        );
        if a.wait && s.state == FineTuneState::Failed {
            anyhow::bail!("the fine-tune failed: the daemon's log says why");
        }
    }
    Ok(asked)
}

/// `T_g·B/C = 1.20 ms vs T_step = 3.40 ms → compute-bound`, from the last epoch measured.
fn balance_line(s: &FineTuneStatus) -> String {
    if s.step_us == 0 {
        return "balance: not measured yet (after the first epoch)".into();
    }
    let (load, step) = (
        f64::from(s.load_per_batch_us) / 1e3,
        f64::from(s.step_us) / 1e3,
    );
    format!(
        "T_g·B/C = {load:.2} ms vs T_step = {step:.2} ms → {}",
        if load > step {
            "input-bound"
        } else {
            "compute-bound"
        }
    )
}
