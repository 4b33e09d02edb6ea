//! After warm-up, delivering a batch, running a training step and answering a camera frame
//! with the frame pass on the GPU allocate nothing, on any thread.
//!
//! This file is its own test binary, so the counting allocator below sees only this test's
//! process: the loader threads, the consumer (this test) and the test harness. It holds one
//! `#[test]` so that no other test allocates concurrently, and prints nothing while counting
//! (captured output allocates).
//!
//! When it fails, run it with `FULCRUM_ALLOC_TRACE=1` (and `--nocapture`): the first few
//! allocations inside the measured window are printed with a backtrace.

use fulcrum::base::SlotBytes;
use fulcrum::compute::exec::{EngineChoice, Exec, ExecOptions};
use fulcrum::compute::recording::LOSS_LEN;
use fulcrum::compute::vulkan::testing;
use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::{AugmentConfig, Dataset, Loader, LoaderConfig};
use fulcrum::model::{init, Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_TRAIN};
use fulcrum_tests::alloc::{allocations, trace, Counting};
use fulcrum_tests::*;

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARM_UP: usize = 4;
const MEASURED: usize = 60;

/// Allocations made (anywhere in the process) while `MEASURED` batches were delivered, after
/// `WARM_UP`; the batches' bytes are summed so that the data is really read.
fn allocations_while_loading(dir: &std::path::Path, io: IoKind) -> (u64, &'static str) {
    let config = LoaderConfig {
        batch: 8,
        ring_slots: 3,
        loaders: 2,
        epochs: 20,
        seed: 3,
        io,
        // Mosaics too: they augment by groups after a unit's reads.
        augment: AugmentConfig {
            mosaic_prob: 0.5,
            ..AugmentConfig::default()
        },
        verify: true,
        ..LoaderConfig::default()
    };
    let dir = dir.to_owned();
    with_timeout("no-alloc run", HANG_TIMEOUT, move || {
        let dataset = Dataset::open(&dir, DirectMode::Auto).expect("open");
        let mut loader = Loader::start(&dataset, &config).expect("start");
        assert!(loader.batches_per_epoch() * config.epochs >= (WARM_UP + MEASURED) as u64);
        let mut checksum = 0u64;
        let mut consume = |loader: &mut Loader, n: usize| {
            for _ in 0..n {
                let batch = loader.next_batch().expect("batch").expect("not the end");
                checksum = batch
                    .records()
                    .iter()
                    .step_by(61)
                    .fold(checksum, |s, &b| s.wrapping_mul(31).wrapping_add(b as u64));
                checksum += batch.box_count(0) as u64 + batch.meta(batch.len() - 1).index;
            }
        };
        consume(&mut loader, WARM_UP);
        // A thread's start allocates (its name, its stack-guard handler) when the OS first runs
        // it, which on a busy machine can be after the warm-up: that is start-up, not delivery.
        wait_for_threads("fulcrum-loader", config.loaders);
        let before = allocations();
        trace(5);
        consume(&mut loader, MEASURED);
        trace(0);
        let during = allocations() - before;
        std::hint::black_box(checksum);
        (during, loader.backend().name())
    })
}

/// Waits (at most a few seconds) until `n` threads whose name starts with `prefix` run, as
/// /proc/self/task/*/comm shows them (a thread sets its name once it has started).
fn wait_for_threads(prefix: &str, n: usize) {
    let running = || {
        std::fs::read_dir("/proc/self/task").map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|comm| comm.starts_with(prefix))
                .count()
        })
    };
    let started = std::time::Instant::now();
    while running().is_ok_and(|k| k < n) && started.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Allocations made during `MEASURED_STEPS` det-s training steps on `engine` (the CPU engine
/// with two threads, or Vulkan with the records in an imported ring slot as the trainer has
/// them), after warm-up: records in, hyper-parameters in, the step, the loss out — what the
/// trainer does per step besides taking the batch. (The Vulkan driver's own allocations go
/// through its C allocator and are not counted: this is about fulcrum's code.)
fn allocations_while_training(dir: &std::path::Path, engine: EngineChoice) -> u64 {
    const MEASURED_STEPS: usize = 3;
    let dataset = Dataset::open(dir, DirectMode::Off).expect("open");
    let model = ModelConfig::named("det-s", dataset.manifest.num_classes()).unwrap();
    let arch = Arch::new(&model);
    let batch = 4;
    let graph = ModelGraph::build(&arch, batch, &dataset.layout, &GraphOptions::default()).unwrap();
    let options = ExecOptions {
        engine,
        threads: 2,
        ..ExecOptions::default()
    };
    let mut exec = Exec::new(&graph.recording, &options).unwrap();
    for (p, v) in graph.params.iter().zip(init::init_params(&arch, 1)) {
        exec.write_f32(p.value, &v).unwrap();
    }
    let bytes = batch as usize * dataset.layout.record_size;
    let mut slot = exec.slot_allocator().map(|a| a.allocate(bytes).unwrap());
    let imported = slot.is_some();
    let mut plain = Vec::new();
    let records: &mut [u8] = match &mut slot {
        Some(slot) => &mut slot.bytes_mut()[..bytes],
        None => {
            plain.resize(bytes, 0);
            &mut plain
        }
    };
    dataset.read_records(0, records).unwrap();
    let records = match &mut slot {
        Some(slot) => SlotBytes::in_memory(&mut **slot, 0..bytes).unwrap(),
        None => SlotBytes::plain(&plain),
    };
    let entry = graph.entry(ENTRY_TRAIN);
    let mut loss = [0f32; LOSS_LEN];
    let mut step = |exec: &mut Exec, k: usize| {
        let hyper = GraphOptions::default().hyper(1e-3, k as u32);
        exec.write_f32(graph.hyper, &hyper).unwrap();
        exec.run_reading(entry, graph.records, records).unwrap();
        exec.read_f32(graph.loss, &mut loss).unwrap();
    };
    for k in 1..=2 {
        step(&mut exec, k);
    }
    if engine == EngineChoice::Cpu {
        wait_for_threads("fulcrum-compute", 1);
    } else {
        assert!(
            imported || !testing::required(),
            "lavapipe imports host memory: the records must come from a slot"
        );
    }
    let before = allocations();
    trace(5);
    let imported_before = exec.imported_uploads();
    let submitted_before = exec.submissions();
    for k in 3..3 + MEASURED_STEPS {
        step(&mut exec, k);
    }
    trace(0);
    let during = allocations() - before;
    if imported {
        assert_eq!(
            exec.imported_uploads() - imported_before,
            MEASURED_STEPS as u64,
            "the measured steps took their records by GPU copies from the slot"
        );
    }
    if engine == EngineChoice::Vulkan {
        assert_eq!(
            exec.submissions() - submitted_before,
            MEASURED_STEPS as u64,
            "a step with its batch's copy is one submission"
        );
    }
    assert!(loss[0].is_finite() && loss[0] > 0.0, "{loss:?}");
    during
}

/// Allocations made while the predictor answers NV12 frames, whole and cropped, with the frame
/// pass on the Vulkan engine's device, after warm-up (the frame copied into the stage's
/// buffer, its windows planned, the kernel and the forward pass submitted, detections read).
fn allocations_while_predicting_with_the_gpu_frame_pass() -> u64 {
    use fulcrum::infer::predict::{FramePlace, Predictor};
    use fulcrum::model::Checkpoint;
    use fulcrum::pixels::{ColourSpace, PixelFormat, Pixels, Rect};
    let model = ModelConfig::named("det-s", 1).unwrap();
    let checkpoint = Checkpoint::initial(model, vec!["thing".into()], 3);
    let options = ExecOptions {
        engine: EngineChoice::Vulkan,
        ..ExecOptions::default()
    };
    let mut predictor = Predictor::new(&checkpoint, &options, 0.0, 50).unwrap();
    predictor.set_frame_place(FramePlace::Gpu).unwrap();
    predictor.reserve_sources(640).unwrap();
    let (w, h) = (640u32, 480u32);
    let frame: Vec<u8> = (0..w * h * 3 / 2).map(|i| (i % 251) as u8).collect();
    let pixels = Pixels::new(
        PixelFormat::Nv12,
        w,
        h,
        0,
        ColourSpace::Bt601Limited,
        &frame,
    )
    .unwrap();
    let crops = [
        None,
        Some(Rect {
            x: 33,
            y: 17,
            width: 301,
            height: 222,
        }),
    ];
    let mut found = Vec::with_capacity(predictor.top_k());
    for crop in crops {
        predictor.predict_into(&pixels, crop, &mut found).unwrap();
    }
    let before = allocations();
    trace(5);
    for _ in 0..3 {
        for crop in crops {
            predictor.predict_into(&pixels, crop, &mut found).unwrap();
        }
    }
    trace(0);
    assert!(!found.is_empty());
    allocations() - before
}

/// One test (see the module docs): loading, then training steps, then frames on the GPU, each
/// measured alone.
#[test]
fn delivering_batches_and_training_steps_allocate_nothing_on_any_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic_sharded(tmp.path(), 96, 32, 40);
    assert!(allocations() > 0, "the counting allocator is not installed");
    for io in backends() {
        let (allocations, backend) = allocations_while_loading(&dir, io);
        assert_eq!(
            allocations, 0,
            "{backend}: {allocations} heap allocations while delivering {MEASURED} batches \
             after warm-up; rerun with FULCRUM_ALLOC_TRACE=1 -- --nocapture to see where"
        );
    }
    let det_s_data = pack_synthetic(&tmp.path().join("det-s"), 8, 128);
    let mut engines = vec![EngineChoice::Cpu];
    if testing::engine("training steps allocate nothing on Vulkan").is_some() {
        engines.push(EngineChoice::Vulkan);
    }
    for &engine in &engines {
        let allocations = allocations_while_training(&det_s_data, engine);
        assert_eq!(
            allocations, 0,
            "{engine:?}: {allocations} heap allocations in training steps after warm-up; rerun \
             with FULCRUM_ALLOC_TRACE=1 -- --nocapture to see where"
        );
    }
    if engines.contains(&EngineChoice::Vulkan) {
        let allocations = allocations_while_predicting_with_the_gpu_frame_pass();
        assert_eq!(
            allocations, 0,
            "{allocations} heap allocations answering frames with the GPU frame pass after \
             warm-up; rerun with FULCRUM_ALLOC_TRACE=1 -- --nocapture to see where"
        );
    }
}
