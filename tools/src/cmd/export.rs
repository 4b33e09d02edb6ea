use std::path::PathBuf;
use std::process::ExitCode;

use fulcrum::model::Checkpoint;
use fulcrum::model::{onnx, Arch};

/// Export a trained detector as an ONNX model (opset 13).
///
/// Input `images`: float32 [N, 3, H, W], RGB scaled to [0, 1] (pixel / 255); output `pred`:
/// float32 [N, K+4, H/8, W/8] — K heat-map logits, then offset x/y and log width/height in
/// grid cells (decode as `fulcrum infer` does: sigmoid, 3×3 peaks, threshold).
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint (`fulcrum train` writes OUT/last.safetensors).
    #[arg(long, value_name = "CHECKPOINT")]
    weights: PathBuf,
    /// Output file.
    #[arg(long, value_name = "OUT.onnx")]
    onnx: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let checkpoint = Checkpoint::load(&a.weights)?;
    let arch = Arch::new(&checkpoint.model);
    let params = arch
        .params()
        .iter()
        .map(|spec| {
            checkpoint
                .weight(&spec.name)
                .map(<[f32]>::to_vec)
                .ok_or_else(|| {
                    anyhow::anyhow!("{}: no tensor {:?}", a.weights.display(), spec.name)
                })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bytes = onnx::export(&arch, &params)?;
    fulcrum::durable::write_atomic(&a.onnx, &bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.onnx.display()))?;
    let model = &checkpoint.model;
    let levels = model.output_levels();
    let channels = model.out_channels();
    let pred = if levels.len() == 1 {
        let (h, w) = levels.grid(0);
        format!("[N, {channels}, {h}, {w}] (stride 8)")
    } else {
        let grids: Vec<String> = (0..levels.len())
            .map(|l| {
                let (h, w) = levels.grid(l);
                format!("{h}×{w} at stride {}", levels.stride(l))
            })
            .collect();
        format!(
            "[N, {channels}, {}] (the cells of {}, one level after another)",
            levels.total_cells(),
            grids.join(", ")
        )
    };
    crate::outln!(
        "{}: {} ({} parameters, {} classes: {}), input images [N, 3, {s}, {s}], output pred {pred}",
        a.onnx.display(),
        fulcrum::base::human(bytes.len() as u64),
        arch.param_count(),
        model.classes,
        checkpoint.classes.join(", "),
        s = model.input
    );
    Ok(ExitCode::SUCCESS)
}
