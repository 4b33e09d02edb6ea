use std::path::PathBuf;
use std::process::ExitCode;

use fulcrum::model::Checkpoint;
use fulcrum::model::{onnx, Arch};

/// Export a trained detector as an ONNX model (opset 13), or as a checkpoint of its weights alone.
///
/// ONNX: input `images`: float32 [N, 3, H, W], RGB scaled to [0, 1] (pixel / 255); output `pred`:
/// float32 [N, K+4, H/8, W/8] — K heat-map logits, then offset x/y and log width/height in
/// grid cells (decode as `fulcrum infer` does: sigmoid, 3×3 peaks, threshold).
///
/// --checkpoint: the averaged weights without the optimizer's state, a quarter of the file, for a
/// board (`infer`, `eval`, `fulcrumd`) or as the `--init-from` of a fine-tune.
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("output").required(true).multiple(true).args(["onnx", "checkpoint"]))]
pub struct Args {
    /// Checkpoint (`fulcrum train` writes OUT/last.safetensors).
    #[arg(long, value_name = "CHECKPOINT")]
    weights: PathBuf,
    /// Write the ONNX model here.
    #[arg(long, value_name = "OUT.onnx")]
    onnx: Option<PathBuf>,
    /// Write the weights alone here, as a fulcrum checkpoint (a run cannot --resume from it).
    #[arg(long, value_name = "OUT.safetensors")]
    checkpoint: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let checkpoint = Checkpoint::load(&a.weights)?;
    if let Some(out) = &a.checkpoint {
        let slim = checkpoint.weights_only();
        slim.save(out)?;
        let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
        crate::outln!(
            "{}: {} ({} of {} tensors: the weights, without the optimizer's state)",
            out.display(),
            fulcrum::base::human(bytes),
            slim.tensors.len(),
            checkpoint.tensors.len()
        );
    }
    let Some(onnx_path) = &a.onnx else {
        return Ok(ExitCode::SUCCESS);
    };
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
    fulcrum::durable::write_atomic(onnx_path, &bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", onnx_path.display()))?;
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
        onnx_path.display(),
        fulcrum::base::human(bytes.len() as u64),
        arch.param_count(),
        model.classes,
        checkpoint.classes.join(", "),
        s = model.input
    );
    Ok(ExitCode::SUCCESS)
}
