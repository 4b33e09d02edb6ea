//! `fulcrum export`'s ONNX model, run in ONNX Runtime (Python `onnxruntime`), gives the same
//! network output as fulcrum's own forward pass on the same images, within 1e-4.
//!
//! Needs `python3` with `onnxruntime` and `numpy`; without them the test prints `SKIP:` and
//! passes, unless `FULCRUM_REQUIRE_ONNXRUNTIME=1` (as in CI), where that is a failure.

use std::process::Command;

use fulcrum::base::SplitMix64;
use fulcrum::compute::exec::{EngineChoice, Exec, ExecOptions};
use fulcrum::format::{RecordLayout, RecordMeta};
use fulcrum::model::{init, onnx, Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_INFER};

const RUNNER: &str = r#"
import sys
import numpy as np
import onnxruntime as ort
model, images, out, n, h, w = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
x = np.fromfile(images, dtype=np.uint8).reshape(n, h, w, 3).transpose(0, 3, 1, 2)
x = np.ascontiguousarray(x.astype(np.float32) / np.float32(255))
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
(pred,) = session.run(["pred"], {"images": x})
pred.astype("<f4").tofile(out)
"#;

fn onnxruntime_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import onnxruntime, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("FULCRUM_REQUIRE_ONNXRUNTIME").is_ok_and(|v| v == "1") {
            panic!("FULCRUM_REQUIRE_ONNXRUNTIME=1 but python3 cannot import onnxruntime and numpy");
        }
        eprintln!("SKIP: ONNX Runtime check skipped: python3 cannot import onnxruntime and numpy");
    }
    ok
}

#[test]
fn exported_model_matches_fulcrum_in_onnx_runtime() {
    exported_matches(ModelConfig::named("det-s", 3).unwrap());
}

/// Three output levels at 160 px (20×20, 10×10, 5×5 grids): the export flattens and
/// concatenates them as fulcrum's own output does.
#[test]
fn exported_three_level_model_matches_fulcrum_in_onnx_runtime() {
    exported_matches(ModelConfig::named_at("det-m", 2, 160).unwrap());
}

fn exported_matches(model: ModelConfig) {
    if !onnxruntime_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let arch = Arch::new(&model);
    // Weights as after some training: the initialisation, perturbed so that no layer is at its
    // special initial values (zero biases, the heat-map prior).
    let mut rng = SplitMix64::new(3);
    let params: Vec<Vec<f32>> = init::init_params(&arch, 5)
        .into_iter()
        .map(|p| {
            p.into_iter()
                .map(|v| v + 0.05 * (rng.next_f32() - 0.5))
                .collect()
        })
        .collect();

    // fulcrum's forward pass on two random images.
    let (n, side) = (2u32, model.input);
    let layout = RecordLayout::new(side, side, 3, 4).unwrap();
    let options = GraphOptions {
        train: false,
        ..GraphOptions::default()
    };
    let graph = ModelGraph::build(&arch, n, &layout, &options).unwrap();
    let mut exec = Exec::new(
        &graph.recording,
        &ExecOptions {
            engine: EngineChoice::Cpu,
            threads: 1,
            ..ExecOptions::default()
        },
    )
    .unwrap();
    for (p, v) in graph.params.iter().zip(&params) {
        exec.write_f32(p.value, v).unwrap();
    }
    let mut images = vec![0u8; (n * side * side * 3) as usize];
    images
        .iter_mut()
        .for_each(|b| *b = (rng.next_u64() >> 56) as u8);
    let mut records = vec![0u8; n as usize * layout.record_size];
    for (i, record) in records.chunks_exact_mut(layout.record_size).enumerate() {
        let image = &images[i * layout.image_bytes..(i + 1) * layout.image_bytes];
        layout.encode(record, image, &RecordMeta::default(), &[]);
    }
    exec.write_bytes(graph.records, &records).unwrap();
    exec.run(graph.entry(ENTRY_INFER)).unwrap();
    let cells = model.output_levels().total_cells() as u32;
    let mut ours = vec![0f32; (n * (model.classes + 4) * cells) as usize];
    exec.read_f32(graph.pred, &mut ours).unwrap();

    // The same images through the exported model in ONNX Runtime.
    let model_path = tmp.path().join("det-s.onnx");
    std::fs::write(&model_path, onnx::export(&arch, &params).unwrap()).unwrap();
    let images_path = tmp.path().join("images.u8");
    std::fs::write(&images_path, &images).unwrap();
    let out_path = tmp.path().join("pred.f32");
    let run = Command::new("python3")
        .arg("-c")
        .arg(RUNNER)
        .args([&model_path, &images_path, &out_path])
        .args([n, side, side].map(|v| v.to_string()))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "onnxruntime failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let theirs: Vec<f32> = std::fs::read(&out_path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(theirs.len(), ours.len(), "output shape");

    // 1e-4 relative to the element, with a floor of 1 (logits and log sizes are of order 1).
    let mut worst = (0f32, 0usize);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        let err = (a - b).abs() / b.abs().max(1.0);
        if err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        worst.0 <= 1e-4,
        "largest difference {:.2e} at element {}: fulcrum {} vs onnxruntime {}",
        worst.0,
        worst.1,
        ours[worst.1],
        theirs[worst.1]
    );
    // The check can fail: outputs vary across the map.
    let spread = ours.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(spread > 0.1, "degenerate output (max |pred| = {spread})");
}
