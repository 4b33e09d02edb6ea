//! The `fulcrum` binary as a user runs it: help, pack → inspect → load → bench, exit codes
//! (0 success, 1 bad records found by inspect, 2 errors), clear messages for bad input, and the
//! io_uring fallback rules, forced with the `FULCRUM_FAULT_URING` fault-injection variable
//! (which only a child process can set without affecting other tests).

use std::path::{Path, PathBuf};

mod common;

use common::{assert_mentions, fulcrum, fulcrum_env};

/// Packs `n` synthetic records of 32×32 (up to 32 boxes: 4 KiB records) into `cwd/name`
/// with the CLI.
fn pack(cwd: &Path, name: &str, n: u64, extra: &[&str]) -> PathBuf {
    let n = n.to_string();
    let mut args = vec![
        "pack",
        "--synthetic",
        &n,
        "--size",
        "32",
        "--max-boxes",
        "32",
        "--out",
        name,
    ];
    args.extend_from_slice(extra);
    fulcrum(cwd, &args).expect(0);
    cwd.join(name)
}

/// Flips one image byte of local record `record` of shard `shard` (4 KiB records at 32×32).
fn corrupt(dir: &Path, shard: u32, record: u64) {
    use std::os::unix::fs::FileExt;
    let path = dir.join(format!("shard-{shard:05}.fsh"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let at = 4096 + record * 4096 + 50;
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[b[0] ^ 0x10], at).unwrap();
}

#[test]
fn help_describes_every_subcommand_and_its_key_options() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let top = fulcrum(cwd, &["--help"]);
    top.expect(0);
    assert_mentions(&top.stdout, &["pack", "inspect", "load", "bench", "board"]);
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["pack", "--help"],
            &[
                "--synthetic",
                "--size",
                "--out",
                "--force",
                "--shard-records",
                "--threads",
                "--max-boxes",
                "--format",
            ],
        ),
        (&["inspect", "--help"], &["--json", "<DIR>", "status 1"]),
        (
            &["load", "--help"],
            &[
                "--epochs",
                "--batch",
                "--ring",
                "--loaders",
                "--io",
                "--direct",
                "--on-corrupt",
                "--no-augment",
                "--seed",
            ],
        ),
        (&["bench", "--help"], &["io", "compute", "balance"]),
        (
            &["bench", "io", "--help"],
            &["--data", "--seconds", "--json", "--batch", "--ring"],
        ),
        (&["board", "--help"], &["pi4", "generic"]),
        (
            &["train", "--help"],
            &[
                "--autotune",
                "--mem-budget",
                "--loader-delay",
                "--io-depth",
                "--resume",
                "--trace",
            ],
        ),
        (
            &["bench", "balance", "--help"],
            &["--slowdown", "--steps", "--json", "--mem-budget", "starved"],
        ),
    ];
    for (args, words) in cases {
        let run = fulcrum(cwd, args);
        run.expect(0);
        assert_mentions(&run.stdout, words);
    }
    // No subcommand: usage on stderr, exit 2.
    let bare = fulcrum(cwd, &[]);
    bare.expect(2);
    assert_mentions(&bare.stderr, &["Usage"]);
}

#[test]
fn pack_then_inspect_verifies_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let run = fulcrum(
        cwd,
        &["pack", "--synthetic", "64", "--size", "32", "--out", "D"],
    );
    run.expect(0);
    assert_mentions(&run.stdout, &["64 records", "32×32"]);
    let inspect = fulcrum(cwd, &["inspect", "D"]);
    inspect.expect(0);
    assert_mentions(
        &inspect.stdout,
        &["all 64 records OK", "64 records in 1 shards"],
    );

    let json = fulcrum(cwd, &["inspect", "D", "--json"]);
    json.expect(0);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("inspect --json");
    assert_eq!(doc["records_verified"], 64);
    assert_eq!(doc["problems"].as_array().map(Vec::len), Some(0));
    assert_eq!(doc["manifest"]["width"], 32);
}

#[test]
fn inspect_of_a_corrupt_dataset_exits_1_naming_shard_and_record() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let dir = pack(cwd, "D", 64, &["--shard-records", "16"]);
    corrupt(&dir, 1, 3);
    corrupt(&dir, 3, 15);
    let run = fulcrum(cwd, &["inspect", "D"]);
    run.expect(1);
    assert_mentions(
        &run.stdout,
        &[
            "2 BAD records of 64",
            "shard-00001.fsh: record 3: checksum mismatch",
            "shard-00003.fsh: record 15: checksum mismatch",
        ],
    );
    let json = fulcrum(cwd, &["inspect", "D", "--json"]);
    json.expect(1);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("inspect --json");
    let problems = doc["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 2);
    assert!(problems[0]["file"]
        .as_str()
        .is_some_and(|f| f.ends_with("shard-00001.fsh")));
    assert_eq!(problems[0]["record"], 3);
}

#[test]
fn load_fails_on_a_corrupt_record_or_substitutes_it_with_skip() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let dir = pack(cwd, "D", 64, &["--shard-records", "16"]);
    corrupt(&dir, 2, 7);
    let fail = fulcrum(cwd, &["load", "D", "--batch", "8"]);
    fail.expect(2);
    assert_mentions(
        &fail.stderr,
        &[
            "shard-00002.fsh: record 7:",
            "checksum",
            "--on-corrupt skip",
        ],
    );
    let skip = fulcrum(cwd, &["load", "D", "--batch", "8", "--on-corrupt", "skip"]);
    skip.expect(0);
    assert_mentions(
        &skip.stdout,
        &["delivered 64 records", "1 corrupt records replaced"],
    );
    assert_mentions(&skip.stderr, &["shard-00002.fsh: record 7"]);
}

#[test]
fn pack_refuses_an_existing_output_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 16, &[]);
    let again = fulcrum(
        cwd,
        &["pack", "--synthetic", "20", "--size", "32", "--out", "D"],
    );
    again.expect(2);
    assert_mentions(&again.stderr, &["D already exists", "--force"]);
    // Nothing was replaced.
    assert_mentions(
        &fulcrum(cwd, &["inspect", "D"]).expect(0).stdout,
        &["all 16 records OK"],
    );
    let forced = fulcrum(
        cwd,
        &[
            "pack",
            "--synthetic",
            "20",
            "--size",
            "32",
            "--out",
            "D",
            "--force",
        ],
    );
    forced.expect(0);
    assert_mentions(
        &fulcrum(cwd, &["inspect", "D"]).expect(0).stdout,
        &["all 20 records OK"],
    );
    // No temporary or old folder is left behind.
    let mut names: Vec<String> = std::fs::read_dir(cwd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".fulcrum-test-"))
        .collect();
    names.sort();
    assert_eq!(names, ["D"]);
}

#[test]
fn bad_option_values_are_clear_errors_not_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let cases: &[(&[&str], &[&str])] = &[
        (&["--io", "nope"], &["--io", "nope", "auto, uring or pread"]),
        (
            &["--on-corrupt", "maybe"],
            &["--on-corrupt", "maybe", "fail or skip"],
        ),
        (
            &["--direct", "sideways"],
            &["--direct", "sideways", "auto, on or off"],
        ),
        (&["--ring", "0"], &["ring", "1 to 64"]),
        (&["--ring", "65"], &["ring", "1 to 64"]),
        (&["--batch", "0"], &["--batch"]),
        (&["--loaders", "0"], &["--loaders"]),
        (
            &["--batch", "1000"],
            &["64 records", "batch of 1000", "--batch"],
        ),
        (&["--batch=-3"], &["--batch", "-3"]),
        (&["--epochs", "lots"], &["--epochs", "lots"]),
    ];
    for (extra, words) in cases {
        let mut args = vec!["load", "D"];
        args.extend_from_slice(extra);
        let run = fulcrum(cwd, &args);
        run.expect(2);
        assert_mentions(&run.stderr, words);
    }
    for (args, words) in [
        (
            &["pack", "--synthetic", "8", "--size", "4", "--out", "E"][..],
            &["--size 4", "8..="][..],
        ),
        (
            &[
                "pack",
                "--synthetic",
                "8",
                "--size",
                "32",
                "--shard-records",
                "0",
                "--out",
                "E",
            ],
            &["--shard-records"],
        ),
        (&["inspect", "nowhere"], &["nowhere", "manifest.json"]),
        (&["board", "pi9"], &["pi9", "pi4"]),
    ] {
        let run = fulcrum(cwd, args);
        run.expect(2);
        assert_mentions(&run.stderr, words);
    }
    assert!(!cwd.join("E").exists(), "a refused pack wrote nothing");
}

#[test]
fn pack_of_a_missing_source_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let run = fulcrum(cwd, &["pack", "no/such/dataset", "--out", "E"]);
    run.expect(2);
    assert_mentions(&run.stderr, &["no/such/dataset", "not found"]);
    assert!(!cwd.join("E").exists());
    // A folder that exists but holds no dataset says what was looked for.
    std::fs::create_dir(cwd.join("empty")).unwrap();
    let run = fulcrum(cwd, &["pack", "empty", "--out", "E"]);
    run.expect(2);
    assert_mentions(&run.stderr, &["empty", "data.yaml", "--synthetic"]);
}

#[test]
fn load_streams_two_epochs() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let run = fulcrum(
        cwd,
        &[
            "load",
            "D",
            "--epochs",
            "2",
            "--batch",
            "16",
            "--loaders",
            "2",
        ],
    );
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &[
            "64 records, batch 16, 4 batches per epoch",
            "delivered 128 records",
        ],
    );
    let run = fulcrum(
        cwd,
        &[
            "load",
            "D",
            "--epochs",
            "2",
            "--batch",
            "16",
            "--io",
            "pread",
            "--no-augment",
        ],
    );
    run.expect(0);
    assert_mentions(&run.stdout, &["pread reads", "delivered 128 records"]);
}

/// The numbers of one measurement in the bench JSON are all positive.
fn assert_positive(doc: &serde_json::Value, key: &str) {
    let m = &doc[key];
    for field in ["records", "bytes", "mb_per_s", "records_per_s"] {
        let v = m[field].as_f64();
        assert!(
            v.is_some_and(|v| v > 0.0),
            "{key}.{field} = {:?} in {doc}",
            m[field]
        );
    }
}

#[test]
fn bench_io_writes_its_figures_as_json() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let run = fulcrum(
        cwd,
        &[
            "bench",
            "io",
            "--data",
            "D",
            "--seconds",
            "0.2",
            "--json",
            "bench.json",
        ],
    );
    run.expect(0);
    assert_mentions(&run.stdout, &["raw sequential read", "pread backend"]);
    let text = std::fs::read_to_string(cwd.join("bench.json")).expect("bench.json written");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for key in ["raw", "pread", "loaders_augment"] {
        assert_positive(&doc, key);
    }
    assert_eq!(doc["records_in_dataset"], 64);
    assert!(doc["loader_cpu_us_per_record"]
        .as_f64()
        .is_some_and(|v| v > 0.0));
}

#[test]
fn bench_compute_measures_the_model_it_is_given() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let args = "bench compute --model det-m --runs 1 --cpu-only --top 3 --batch 2 --json c.json";
    let run = fulcrum(cwd, &args.split(' ').collect::<Vec<_>>());
    run.expect(0);
    assert_mentions(&run.stdout, &["det-m at 256×256", "training step, batch 2"]);
    let text = std::fs::read_to_string(cwd.join("c.json")).expect("c.json written");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(
        (&doc["model"], &doc["input"]),
        (&"det-m".into(), &256.into())
    );
    let cpu = &doc["engines"][0];
    let det_m = fulcrum::model::ModelConfig::named("det-m", 2).unwrap();
    assert_eq!(
        cpu["params"].as_u64(),
        Some(fulcrum::model::Arch::new(&det_m).param_count() as u64)
    );
    for entry in ["forward_batch1", "train_step"] {
        assert!(cpu[entry]["device_ms"].as_f64().is_some_and(|v| v > 0.0));
        assert!(!cpu[entry]["per_kernel"].as_array().unwrap().is_empty());
    }

    let bad = fulcrum(cwd, &["bench", "compute", "--model", "det-x"]);
    bad.expect(2);
    assert_mentions(&bad.stderr, &["det-x", "det-s, det-m or det-l"]);
}

#[test]
fn bench_frames_times_each_kernel_set_and_the_gpu_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let gpu = fulcrum::compute::vulkan::testing::required();
    let mut args = vec!["bench", "frames", "--formats", "nv12,bgra8", "--runs", "10"];
    args.extend_from_slice(&["--best-only", "--json", "f.json"]);
    if gpu {
        args.push("--gpu");
    }
    let run = fulcrum(cwd, &args);
    run.expect(0);
    assert_mentions(&run.stdout, &["NV12", "BGRA8", "1920x1080", "256 (det-m)"]);
    let text = std::fs::read_to_string(cwd.join("f.json")).expect("f.json written");
    let figures: Vec<serde_json::Value> = serde_json::from_str(&text).expect("valid JSON");
    let of = |kernels: &str| {
        figures
            .iter()
            .filter(|f| f["kernels"] == kernels)
            .collect::<Vec<_>>()
    };
    // Two formats × three frame sizes × two inputs, each with the portable baseline first.
    let portable = of("portable");
    assert_eq!(portable.len(), 12, "{text}");
    for f in &portable {
        assert_eq!(f["ratio_to_portable"], 1.0, "{f}");
        assert!(f["median_us"].as_f64().is_some_and(|v| v > 0.0), "{f}");
        assert!(f["p99_us"].as_f64() >= f["median_us"].as_f64(), "{f}");
    }
    if gpu {
        let on_gpu = of("gpu");
        assert_eq!(on_gpu.len(), 12, "{text}");
        for f in on_gpu {
            // lavapipe's queue has timestamps: the kernel's own time is in the wall time.
            let kernel = f["kernel_median_us"].as_f64().expect("the kernel's time");
            assert!(
                kernel > 0.0 && kernel <= f["median_us"].as_f64().unwrap(),
                "{f}"
            );
        }
    }
    let bad = fulcrum(cwd, &["bench", "frames", "--device", "0"]);
    bad.expect(2);
    assert_mentions(&bad.stderr, &["--gpu"]);
}

#[test]
fn bench_io_runs_without_io_uring() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let run = fulcrum_env(
        cwd,
        &[
            "bench",
            "io",
            "--data",
            "D",
            "--seconds",
            "0.2",
            "--json",
            "bench.json",
        ],
        &[("FULCRUM_FAULT_URING", "EPERM")],
    );
    run.expect(0);
    let text = std::fs::read_to_string(cwd.join("bench.json")).expect("bench.json written");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert!(doc["uring"].is_null());
    assert!(doc["uring_unavailable"]
        .as_str()
        .is_some_and(|w| w.contains("Operation not permitted")));
    for key in ["raw", "pread", "loaders_augment"] {
        assert_positive(&doc, key);
    }
}

#[test]
fn io_uring_unavailable_falls_back_to_pread_only_under_auto() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let load = |io: &str, fault: &str| {
        fulcrum_env(
            cwd,
            &["load", "D", "--io", io, "--batch", "16"],
            &[("FULCRUM_FAULT_URING", fault)],
        )
    };

    // Unavailable (seccomp, io_uring_disabled; old kernel, qemu-user): auto reads with pread
    // and says why.
    for (fault, why) in [
        ("EPERM", "Operation not permitted"),
        ("ENOSYS", "Function not implemented"),
    ] {
        let run = load("auto", fault);
        run.expect(0);
        assert_mentions(&run.stdout, &["pread reads", "delivered 64 records"]);
        assert_mentions(
            &run.stderr,
            &["io_uring unavailable", why, "reading with pread"],
        );

        // Asked for explicitly, it is an error naming io_uring and the way out.
        let run = load("uring", fault);
        run.expect(2);
        assert_mentions(&run.stderr, &["io_uring is unavailable", why, "--io pread"]);
    }

    // A resource error is never a reason to fall back: it is reported, with what to raise.
    let run = load("auto", "ENOMEM");
    run.expect(2);
    assert_mentions(
        &run.stderr,
        &["io_uring setup failed", "resource limit", "ulimit -l"],
    );
    assert!(!run.both().contains("delivered"), "{}", run.both());

    // pread never touches io_uring.
    load("pread", "ENOMEM").expect(0);
}

#[test]
fn o_direct_refused_falls_back_to_buffered_reads_unless_required() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let refused = [("FULCRUM_FAULT_DIRECT", "EINVAL")];
    let load = |direct: &str, env: &[(&str, &str)]| {
        fulcrum_env(
            cwd,
            &["load", "D", "--direct", direct, "--batch", "16"],
            env,
        )
    };

    // A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6): auto says so once and
    // reads through the page cache, delivering everything.
    let run = load("auto", &refused);
    run.expect(0);
    assert_mentions(&run.stdout, &["(buffered)", "delivered 64 records"]);
    assert_mentions(&run.stderr, &["O_DIRECT refused", "using buffered reads"]);
    assert_eq!(
        run.stderr.matches("O_DIRECT refused").count(),
        1,
        "said once: {}",
        run.stderr
    );

    // Required, it is an error naming the shard.
    let run = load("on", &refused);
    run.expect(2);
    assert_mentions(&run.stderr, &["O_DIRECT was required", "shard-00000.fsh"]);

    // Without the refusal, the same dataset reads with O_DIRECT (ext4 and friends).
    let run = load("auto", &[]);
    run.expect(0);
    assert_mentions(&run.stdout, &["with O_DIRECT"]);
}

#[test]
fn balance_explains_the_equation_from_flags_or_a_bench_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // A field example (28 ms a record on a slow board): 28 ms × 32 / 4 = 224 ms per batch
    // against a 10.4 ms step.
    let run = fulcrum(
        cwd,
        &[
            "balance", "--tg", "28ms", "--cores", "4", "--batch", "32", "--step", "10.4ms",
            "--decode", "25ms",
        ],
    );
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &[
            "224.00 ms per batch",
            "input-bound",
            "loader CPU",
            "idle 95.4 %",
            "87 loader cores",
            "with packing (no decode): T_g = 3.000 ms",
        ],
    );

    let run = fulcrum(
        cwd,
        &[
            "balance", "--tg", "30us", "--cores", "2", "--batch", "32", "--step", "40ms", "--json",
        ],
    );
    run.expect(0);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(doc["binding"], "device");
    assert_eq!(doc["device_idle"], 0.0);

    // Measured numbers from a bench file: a slow disk makes the disk the binding resource.
    let bench = serde_json::json!({
        "loader_cpu_us_per_record": 30.0, "loaders": 2, "batch": 32, "record_bytes": 53248,
        "raw": {"mb_per_s": 10.0}
    });
    std::fs::write(cwd.join("io.json"), bench.to_string()).unwrap();
    let run = fulcrum(cwd, &["balance", "--from", "io.json", "--step", "40ms"]);
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &["disk bandwidth binds", "170.39 ms to read a batch"],
    );

    for bad in [
        vec![
            "balance", "--tg", "fast", "--cores", "4", "--batch", "32", "--step", "1ms",
        ],
        vec![
            "balance", "--tg", "1ms", "--cores", "0", "--batch", "32", "--step", "1ms",
        ],
        vec!["balance", "--from", "missing.json", "--step", "1ms"],
        vec!["balance", "--step", "1ms"],
    ] {
        let run = fulcrum(cwd, &bad);
        run.expect(2);
        assert!(!run.both().contains("panicked"), "{}", run.both());
    }
}

#[test]
fn mem_budget_refuses_what_does_not_fit_and_reports_every_allocation() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    let run = fulcrum(cwd, &["load", "D", "--batch", "16", "--memory-report"]);
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &[
            "planned and allocated up front",
            "ring slots",
            "augmentation scratch",
            "total",
        ],
    );

    // 32×32 records are one 4 KiB page: 8 slots of 16 need 512 KiB plus ~20 KiB of the rest.
    let over = [
        "load",
        "D",
        "--batch",
        "16",
        "--ring",
        "8",
        "--mem-budget",
        "300k",
    ];
    let run = fulcrum(cwd, &over);
    run.expect(2);
    let expected = [
        "--mem-budget is 300.0 KiB",
        "--batch 8 fits at --ring 8",
        "--ring 4 fits at --batch 16",
        "ring slots",
    ];
    assert_mentions(&run.stderr, &expected);
    assert!(
        !run.stdout.contains("delivered"),
        "nothing runs over budget: {}",
        run.stdout
    );
    fulcrum(
        cwd,
        &[
            "load",
            "D",
            "--batch",
            "8",
            "--ring",
            "8",
            "--mem-budget",
            "300k",
        ],
    )
    .expect(0);

    let run = fulcrum(
        cwd,
        &[
            "load",
            "D",
            "--batch",
            "16",
            "--ring",
            "8",
            "--mem-budget",
            "40k",
        ],
    );
    run.expect(2);
    assert_mentions(&run.stderr, &["lower both --batch and --ring"]);

    let run = fulcrum(cwd, &["load", "D", "--mem-budget", "lots"]);
    run.expect(2);
    assert_mentions(&run.stderr, &["not a size"]);
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let be = |o: usize| u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn previews_draw_records_in_a_grid() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack(cwd, "D", 64, &[]);
    // The first 32 records of 32×32, 8 to a row, 2 px apart: 8·34−2 by 4·34−2.
    fulcrum(cwd, &["inspect", "D", "--preview", "stored.png"]).expect(0);
    assert_eq!(png_size(&cwd.join("stored.png")), (270, 134));
    // The first delivered batch of 16: two rows.
    fulcrum(
        cwd,
        &["load", "D", "--batch", "16", "--preview", "batch.png"],
    )
    .expect(0);
    assert_eq!(png_size(&cwd.join("batch.png")), (270, 66));
}

#[test]
fn devices_lists_vulkan_and_the_cpu_and_survives_a_machine_without_vulkan() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fulcrum(tmp.path(), &["devices"]);
    run.expect(0);
    assert!(run.stdout.contains("CPU: "), "{}", run.both());
    // No loader at all (as on a board without Vulkan): still exit 0, the reason said.
    let run = fulcrum_env(
        tmp.path(),
        &["devices"],
        &[("FULCRUM_VULKAN_LOADER", "/nonexistent/libvulkan.so.1")],
    );
    run.expect(0);
    assert!(
        run.stdout.contains("Vulkan: unavailable: no Vulkan loader")
            && run.stdout.contains("CPU: "),
        "{}",
        run.both()
    );
    let run = fulcrum_env(
        tmp.path(),
        &["devices", "--json"],
        &[("FULCRUM_VULKAN_LOADER", "/nonexistent/libvulkan.so.1")],
    );
    run.expect(0);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert!(v["vulkan"].is_null() && v["cpu_threads"].as_u64().unwrap() >= 1);
    if fulcrum::compute::vulkan::testing::required() {
        let run = fulcrum(tmp.path(), &["devices", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert!(
            !v["vulkan"]["devices"].as_array().unwrap().is_empty(),
            "{}",
            run.stdout
        );
        assert_eq!(v["picked"], 0);
        // lavapipe imports host memory: the ring's slots can be the device's.
        assert_eq!(
            v["vulkan"]["devices"][0]["host_import_alignment"], 4096,
            "{}",
            run.stdout
        );
        let run = fulcrum(tmp.path(), &["devices"]);
        assert!(
            run.stdout.contains("ring slots imported (no CPU copy)"),
            "{}",
            run.both()
        );
    }
}

/// Packs `n` synthetic records at det-s's 128×128 into `cwd/name`.
fn pack_for_training(cwd: &Path, name: &str, n: u64) -> PathBuf {
    let n = n.to_string();
    fulcrum(cwd, &["pack", "--synthetic", &n, "--out", name]).expect(0);
    cwd.join(name)
}

#[test]
fn train_autotune_prints_its_decisions_and_bench_balance_compares_both_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    pack_for_training(cwd, "D", 96);
    let common = ["--engine", "cpu", "--threads", "1", "--batch", "8"];

    let mut args = vec!["train", "--data", "D", "--out", "run", "--autotune"];
    args.extend_from_slice(&["--epochs", "1", "--max-steps", "6", "--loader-delay", "2ms"]);
    args.extend_from_slice(&common);
    let run = fulcrum(cwd, &args);
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &[
            "autotune (step 0):",
            "loader(s)",
            "T_step",
            "ring 2",
            "I/O queue depth",
            "device idle waiting for input",
        ],
    );

    let mut args = vec!["bench", "balance", "--data", "D", "--steps", "24"];
    args.extend_from_slice(&["--json", "balance.json"]);
    args.extend_from_slice(&common);
    let run = fulcrum(cwd, &args);
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &["starved", "autotuned", "device idle", "goal"],
    );
    let text = std::fs::read_to_string(cwd.join("balance.json")).expect("balance.json written");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(doc["starved"]["tuning"]["loaders"], 1, "{doc}");
    assert_eq!(doc["starved"]["steps"], 24);
    assert_eq!(doc["autotuned"]["steps"], 24);
    // One loader needs 3 steps per batch: the equation asks for more.
    assert!(
        doc["autotuned"]["tuning"]["loaders"]
            .as_u64()
            .is_some_and(|n| n >= 2),
        "{doc}"
    );
    for run in ["starved", "autotuned"] {
        let idle = doc[run]["device_idle"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&idle), "{run}: {idle}");
    }
    assert!(doc["delay_per_record_ms"].as_f64().is_some_and(|d| d > 0.0));
}

/// A PNG whose header declares `w × h` pixels (the pixel data is a stub: the size check must
/// come before any decoding).
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32fast_png(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(
        &mut png,
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    );
    chunk(&mut png, b"IEND", &[]);
    png
}

/// The CRC-32 PNG chunks carry (the zlib polynomial), bit by bit: tests only.
fn crc32fast_png(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn hostile_inputs_give_short_errors_that_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();

    // A folder whose only image declares 60000 × 60000 px: the image and the reason are named.
    let huge = cwd.join("huge");
    std::fs::create_dir_all(huge.join("images")).unwrap();
    std::fs::create_dir_all(huge.join("labels")).unwrap();
    std::fs::write(huge.join("images/big.png"), png_header_only(60000, 60000)).unwrap();
    std::fs::write(huge.join("labels/big.txt"), "0 0.5 0.5 0.2 0.2\n").unwrap();
    let run = fulcrum(cwd, &["pack", "huge", "--out", "huge-out"]);
    run.expect(2);
    assert_mentions(
        &run.stderr,
        &[
            "big.png",
            "60000×60000",
            "decoding limit",
            "nothing to pack",
        ],
    );

    // A 10 MB token in a label line: rejected with file and line, quoted in a few dozen bytes.
    let tok = cwd.join("tok");
    std::fs::create_dir_all(tok.join("images")).unwrap();
    std::fs::create_dir_all(tok.join("labels")).unwrap();
    let jpg = std::fs::read_dir(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/coco128/images"),
    )
    .expect("the shared coco128 images")
    .map(|e| e.unwrap().path())
    .find(|p| p.extension().is_some_and(|e| e == "jpg"))
    .unwrap();
    std::fs::copy(jpg, tok.join("images/a.jpg")).unwrap();
    let line = format!("0 0.5 0.5 0.2 {}\n", "9".repeat(10_000_000));
    std::fs::write(tok.join("labels/a.txt"), line).unwrap();
    let run = fulcrum(cwd, &["pack", "tok", "--out", "tok-out"]);
    run.expect(0);
    assert_mentions(
        &run.stderr,
        &["a.txt:1:", "(10000000 bytes) is not a finite number"],
    );
    assert!(
        run.both().len() < 4096,
        "{} bytes of output",
        run.both().len()
    );

    // eval on fewer images than one batch: no made-up loss of 0.000.
    pack_for_training(cwd, "train", 32);
    fulcrum(
        cwd,
        &[
            "train",
            "--engine",
            "cpu",
            "--data",
            "train",
            "--out",
            "run",
            "--max-steps",
            "2",
            "--batch",
            "8",
        ],
    )
    .expect(0);
    let tiny = pack_for_training(cwd, "tiny", 5);
    let eval = |extra: &[&str]| {
        let weights = "run/last.safetensors";
        let mut args = vec![
            "eval",
            "--engine",
            "cpu",
            "--weights",
            weights,
            "--data",
            "tiny",
        ];
        args.extend_from_slice(extra);
        let run = fulcrum(cwd, &args);
        run.expect(0);
        run.both()
    };
    let out = eval(&[]);
    assert!(!out.contains("loss 0.000"), "{out}");
    assert_mentions(&out, &["no loss (fewer images than one batch of 16"]);
    assert_mentions(&eval(&["--batch", "5"]), &["; loss "]);
    assert!(tiny.is_dir());
}

/// `eval` scores as COCO does (AP@0.5 and AP@[.5:.95], per class and size, in text and JSON);
/// `infer --coco` writes COCO's results format with ids from file names, positions or a COCO
/// annotations file, and refuses an annotations file that lacks an image or class.
#[test]
fn eval_scores_as_coco_and_infer_writes_coco_results() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let raccoon = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/raccoon");
    let images: Vec<String> = (1..=4)
        .map(|i| {
            let p = raccoon.join(format!("images/raccoon-{i}.jpg"));
            p.to_string_lossy().into_owned()
        })
        .collect();
    let raccoon = raccoon.to_string_lossy();
    fulcrum(cwd, &["pack", &raccoon, "--out", "data"]).expect(0);
    let train = [
        "train",
        "--engine",
        "cpu",
        "--data",
        "data",
        "--out",
        "run",
        "--max-steps",
        "3",
        "--batch",
        "8",
    ];
    fulcrum(cwd, &train).expect(0);
    let weights = "run/last.safetensors";

    let eval = fulcrum(
        cwd,
        &[
            "eval",
            "--engine",
            "cpu",
            "--weights",
            weights,
            "--data",
            "data",
            "--json",
            "e.json",
        ],
    );
    eval.expect(0);
    assert_mentions(
        &eval.stdout,
        &[
            "AP@0.5",
            "AP@[.5:.95]",
            "small < 32² px",
            "large > 96² px",
            "mAP@[.5:.95] ",
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cwd.join("e.json")).unwrap()).unwrap();
    let (map, map_50_95) = (
        json["map"].as_f64().unwrap(),
        json["map_50_95"].as_f64().unwrap(),
    );
    assert!((0.0..=1.0).contains(&map) && map_50_95 <= map, "{json}");
    let sizes = json["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 3, "{json}");
    assert_eq!(sizes[2]["size"], "large");
    let boxes: u64 = sizes.iter().map(|s| s["truth"].as_u64().unwrap()).sum();
    assert_eq!(boxes, json["truth"][0].as_u64().unwrap(), "{json}");

    let infer = |extra: &[&str]| {
        let mut args = vec!["infer", "--engine", "cpu", "--weights", weights];
        args.extend(images.iter().map(String::as_str));
        args.extend_from_slice(extra);
        fulcrum(cwd, &args)
    };
    let read = |name: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(cwd.join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    infer(&["--coco", "dets.json"]).expect(0);
    let dets = read("dets.json");
    assert!(!dets.is_empty());
    for d in &dets {
        // Positions from 1 (the names are not numbers), class indices, boxes as x, y, w, h.
        assert!((1..=4).contains(&d["image_id"].as_u64().unwrap()), "{d}");
        assert_eq!(d["category_id"], 0, "{d}");
        let b: Vec<f64> = (d["bbox"].as_array().unwrap().iter())
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(b.len() == 4 && b.iter().all(|&v| v >= 0.0), "{d}");
        // The scoring threshold of --coco (0.01), not the display one (0.3).
        assert!(d["score"].as_f64().unwrap() >= 0.01, "{d}");
    }
    assert!(dets.iter().any(|d| d["score"].as_f64().unwrap() < 0.3));

    // Duplicate suppression: by default no two detections of an image and class overlap by
    // more than 0.6; `--nms 1` keeps them all, a superset; a limit outside (0, 1] is refused,
    // by `eval` too.
    infer(&["--coco", "all.json", "--nms", "1"]).expect(0);
    let all = read("all.json");
    let overlap = |a: &serde_json::Value, b: &serde_json::Value| {
        let r = |d: &serde_json::Value| -> Vec<f64> {
            (d["bbox"].as_array().unwrap().iter())
                .map(|v| v.as_f64().unwrap())
                .collect()
        };
        let (a, b) = (r(a), r(b));
        let iw = ((a[0] + a[2]).min(b[0] + b[2]) - a[0].max(b[0])).max(0.0);
        let ih = ((a[1] + a[3]).min(b[1] + b[3]) - a[1].max(b[1])).max(0.0);
        iw * ih / (a[2] * a[3] + b[2] * b[3] - iw * ih)
    };
    let same_image = |a: &serde_json::Value, b: &serde_json::Value| {
        a["image_id"] == b["image_id"] && a["category_id"] == b["category_id"]
    };
    let worst = |set: &[serde_json::Value]| {
        let mut worst = 0.0f64;
        for (i, a) in set.iter().enumerate() {
            for b in set[i + 1..].iter().filter(|b| same_image(a, b)) {
                worst = worst.max(overlap(a, b));
            }
        }
        worst
    };
    assert!(worst(&dets) <= 0.6 + 0.02, "{}", worst(&dets));
    // (Whether suppression finds duplicates to drop is the Predictor's test; this model's
    // peaks barely overlap.)
    assert!(all.len() >= dets.len(), "{} vs {}", all.len(), dets.len());
    assert!(dets.iter().all(|d| all.contains(d)));
    // The JSON lines print boxes to 0.1 px and scores to 1e-4, without f32 noise.
    let lines = infer(&["--threshold", "0.01"]);
    lines.expect(0);
    let mut numbers = 0;
    for line in lines.stdout.lines() {
        for list in line.split("\"box\":[").skip(1) {
            for v in list[..list.find(']').unwrap()].split(',') {
                let decimals = v.split('.').nth(1).map_or(0, str::len);
                assert!(decimals <= 1, "box value {v} in {line}");
                numbers += 1;
            }
        }
        for v in line.split("\"score\":").skip(1) {
            let v = &v[..v.find([',', '}']).unwrap()];
            assert!(v.split('.').nth(1).map_or(0, str::len) <= 4, "score {v}");
        }
    }
    assert!(numbers > 0, "no boxes printed: {}", lines.stdout);
    let run = infer(&["--nms", "0"]);
    run.expect(2);
    assert_mentions(&run.stderr, &["--nms", "not in (0, 1]"]);
    let run = fulcrum(
        cwd,
        &[
            "eval",
            "--weights",
            weights,
            "--data",
            "data",
            "--nms",
            "1.5",
        ],
    );
    run.expect(2);
    assert_mentions(&run.stderr, &["--nms", "not in (0, 1]"]);

    let annotations = serde_json::json!({
        "images": (1..=4).map(|i| serde_json::json!({
            "id": 100 + i, "file_name": format!("raccoon-{i}.jpg")})).collect::<Vec<_>>(),
        "annotations": [],
        "categories": [{"id": 7, "name": "raccoon"}],
    });
    std::fs::write(cwd.join("instances.json"), annotations.to_string()).unwrap();
    infer(&["--coco", "ids.json", "--coco-ids", "instances.json"]).expect(0);
    for d in read("ids.json") {
        assert!(
            (101..=104).contains(&d["image_id"].as_u64().unwrap()),
            "{d}"
        );
        assert_eq!(d["category_id"], 7, "{d}");
    }
    let mut lacking = annotations.clone();
    lacking["categories"][0]["name"] = "cat".into();
    std::fs::write(cwd.join("cats.json"), lacking.to_string()).unwrap();
    let run = infer(&["--coco", "x.json", "--coco-ids", "cats.json"]);
    run.expect(2);
    assert_mentions(
        &run.stderr,
        &["class \"raccoon\" is not a category of cats.json"],
    );
    assert!(!cwd.join("x.json").exists());
}

/// Boxes over `--max-boxes` are a loud warning naming the value that keeps them; the default
/// keeps every box of coco128's crowd photos (up to 42 in one image).
#[test]
fn pack_says_loudly_when_it_leaves_boxes_out() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let coco128 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/coco128");
    let coco128 = coco128.to_string_lossy();
    let run = fulcrum(cwd, &["pack", &coco128, "--out", "a", "--max-boxes", "32"]);
    run.expect(0);
    assert_mentions(
        &run.stderr,
        &[
            "22 labelled boxes in 3 images are NOT in the pack",
            "--max-boxes 42 (the most",
        ],
    );
    let run = fulcrum(cwd, &["pack", &coco128, "--out", "b"]);
    run.expect(0);
    assert_mentions(&run.stdout, &["0 over --max-boxes 100"]);
    assert!(!run.stderr.contains("NOT in the pack"), "{}", run.stderr);
}

/// `run/last.safetensors` exports to ONNX, and the summary it prints mentions `words`.
fn export_mentions(cwd: &Path, words: &[&str]) {
    let export = fulcrum(
        cwd,
        &[
            "export",
            "--weights",
            "run/last.safetensors",
            "--onnx",
            "m.onnx",
        ],
    );
    export.expect(0);
    assert_mentions(&export.stdout, words);
}

/// `run/last.safetensors` finds objects in a raccoon photo (650 px wide), on the CPU engine.
fn infer_on_a_raccoon(cwd: &Path) {
    let raccoon = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/raccoon/images/raccoon-1.jpg");
    let infer = fulcrum(
        cwd,
        &[
            "infer",
            "--engine",
            "cpu",
            "--weights",
            "run/last.safetensors",
            &raccoon.to_string_lossy(),
        ],
    );
    infer.expect(0);
    assert_mentions(&infer.stdout, &["\"width\":650"]);
}

/// The input size is the pack's `--size`: training builds the model at it, the checkpoint
/// keeps it, eval, infer and export use it, and every mismatch is a clear error.
#[test]
fn the_input_size_flows_from_pack_to_export() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    fulcrum(
        cwd,
        &[
            "pack",
            "--synthetic",
            "16",
            "--size",
            "160",
            "--out",
            "d160",
        ],
    )
    .expect(0);
    let train = |data: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--engine",
            "cpu",
            "--data",
            data,
            "--out",
            "run",
            "--max-steps",
            "2",
            "--batch",
            "8",
        ];
        args.extend_from_slice(extra);
        fulcrum(cwd, &args)
    };
    train("d160", &[]).expect(0);
    let c = fulcrum::model::Checkpoint::load(&cwd.join("run/last.safetensors")).unwrap();
    assert_eq!((c.model.name.as_str(), c.model.input), ("det-s", 160));

    export_mentions(cwd, &["input images [N, 3, 160, 160]"]);
    infer_on_a_raccoon(cwd);

    // Mismatches: eval on data of another size, resuming on it, and sizes no model takes.
    fulcrum(cwd, &["pack", "--synthetic", "16", "--out", "d128"]).expect(0);
    let eval = fulcrum(
        cwd,
        &[
            "eval",
            "--engine",
            "cpu",
            "--weights",
            "run/last.safetensors",
            "--data",
            "d128",
        ],
    );
    eval.expect(2);
    assert_mentions(
        &eval.stderr,
        &["the model takes 160×160: pack with --size 160"],
    );
    let resume = train("d128", &["--resume"]);
    resume.expect(2);
    assert_mentions(&resume.stderr, &["a det-s@160", "--data makes a det-s@128"]);
    let odd = fulcrum(
        cwd,
        &["pack", "--synthetic", "8", "--size", "100", "--out", "d100"],
    );
    odd.expect(0);
    assert_mentions(&odd.stderr, &["--size 100: no model trains at this size"]);
    let refused = train("d100", &[]);
    refused.expect(2);
    assert_mentions(
        &refused.stderr,
        &[
            "records are 100×100 px",
            "multiple of 32 from 128 to 640",
            "--size 128",
        ],
    );
}

/// A three-level model through the whole path: train, eval, infer and export at 160 px, the
/// ONNX output the levels' cells one after another; an unknown model is a clear error.
#[test]
fn a_three_level_model_trains_evaluates_infers_and_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let args = ["pack", "--synthetic", "16", "--size", "160", "--out", "d"];
    fulcrum(cwd, &args).expect(0);
    let train = |model: &str| {
        fulcrum(
            cwd,
            &[
                "train",
                "--engine",
                "cpu",
                "--data",
                "d",
                "--out",
                "run",
                "--model",
                model,
                "--max-steps",
                "2",
                "--batch",
                "8",
            ],
        )
    };
    train("det-m").expect(0);
    let c = fulcrum::model::Checkpoint::load(&cwd.join("run/last.safetensors")).unwrap();
    assert_eq!(
        (c.model.name.as_str(), c.model.input, c.model.levels),
        ("det-m", 160, 3)
    );
    let eval = fulcrum(
        cwd,
        &[
            "eval",
            "--engine",
            "cpu",
            "--weights",
            "run/last.safetensors",
            "--data",
            "d",
        ],
    );
    eval.expect(0);
    assert_mentions(&eval.stdout, &["mAP@0.5"]);
    infer_on_a_raccoon(cwd);
    // 20×20 + 10×10 + 5×5 cells.
    export_mentions(cwd, &["[N, 6, 525]"]);
    // The weights alone: under half the file, and evaluated to the same figures.
    let slim = fulcrum(
        cwd,
        &[
            "export",
            "--weights",
            "run/last.safetensors",
            "--checkpoint",
            "slim.safetensors",
        ],
    );
    slim.expect(0);
    assert_mentions(&slim.stdout, &["without the optimizer's state"]);
    let size = |f: &str| std::fs::metadata(cwd.join(f)).unwrap().len();
    assert!(size("slim.safetensors") * 2 < size("run/last.safetensors"));
    let slim_eval = fulcrum(
        cwd,
        &[
            "eval",
            "--engine",
            "cpu",
            "--weights",
            "slim.safetensors",
            "--data",
            "d",
        ],
    );
    slim_eval.expect(0);
    let scores = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains("mAP"))
            .map(|l| l.split("; cpu").next().unwrap_or(l).to_owned())
            .collect()
    };
    assert!(!scores(&eval.stdout).is_empty());
    assert_eq!(scores(&slim_eval.stdout), scores(&eval.stdout));
    // A run cannot resume from the weights alone, and says what to do instead.
    std::fs::create_dir(cwd.join("slim")).unwrap();
    std::fs::copy(
        cwd.join("slim.safetensors"),
        cwd.join("slim/last.safetensors"),
    )
    .unwrap();
    let resume = fulcrum(
        cwd,
        &[
            "train", "--engine", "cpu", "--data", "d", "--out", "slim", "--resume", "--model",
            "det-m",
        ],
    );
    resume.expect(2);
    assert_mentions(&resume.stderr, &["weights alone", "--init-from"]);
    let neither = fulcrum(cwd, &["export", "--weights", "run/last.safetensors"]);
    neither.expect(2);
    assert_mentions(&neither.stderr, &["--onnx", "--checkpoint"]);
    let unknown = train("det-xl");
    unknown.expect(2);
    assert_mentions(&unknown.stderr, &["det-xl", "det-s, det-m or det-l"]);
}

#[test]
fn the_photos_recipe_sets_what_is_not_given_and_the_checkpoint_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    fulcrum(
        cwd,
        &["pack", "--synthetic", "24", "--size", "128", "--out", "d"],
    )
    .expect(0);
    let recipe_run = |out: &str, extra: &[&str]| {
        let args = [
            "train", "--engine", "cpu", "--data", "d", "--recipe", "photos",
        ];
        let more = ["--batch", "8", "--max-steps", "3", "--out", out];
        fulcrum(cwd, &[&args[..], &more, extra].concat())
    };
    let run = recipe_run("run", &["--neighbour-radius", "2"]);
    run.expect(0);
    // 24 records in batches of 8: 3 steps per epoch, 1200 steps → 300 epochs (the most); the
    // reach given wins over the recipe's 1.
    assert_mentions(
        &run.stdout,
        &["recipe photos: det-m, batch 8, 300 epochs, lr 0.01 with 50 warm-up steps, mosaic 0.5, \
           gradient norm clipped at 10, box neighbours weighted 0.75 within 2 cells"],
    );
    // Clipping shows on the epoch lines.
    assert_mentions(&run.stdout, &["grad norm ", " steps)"]);
    let c = fulcrum::model::Checkpoint::load(&cwd.join("run/last.safetensors")).unwrap();
    let t = c.train.clone().expect("the run's configuration");
    assert_eq!(c.model.name, "det-m");
    assert_eq!(
        (t["epochs"].as_u64(), t["batch"].as_u64()),
        (Some(300), Some(8))
    );
    assert_eq!(
        (
            t["mosaic"].as_f64(),
            t["lr"].as_f64(),
            t["clip_norm"].as_f64(),
            t["neighbours"].as_f64(),
            t["neighbour_radius"].as_u64()
        ),
        (
            Some(0.5),
            Some(0.01f32 as f64),
            Some(10.0),
            Some(0.75),
            Some(2)
        )
    );
    assert_eq!(c.neighbour_radius(), 2, "eval and fine-tuning read it back");
    // The recipe's det-m starts from the built-in base; --from-scratch from the seed's
    // initial weights. Three steps in warm-up move the weights by little, so a run's
    // weights lie far nearer to where it started than to the other start.
    assert_mentions(&run.stdout, &["starting from the built-in base"]);
    let base = fulcrum::model::builtin_base::for_model("det-m", 128)
        .unwrap()
        .unwrap();
    let initial = fulcrum::model::Checkpoint::initial(c.model.clone(), c.classes.clone(), 0);
    let distance = |a: &fulcrum::model::Checkpoint, b: &fulcrum::model::Checkpoint| -> f64 {
        let arch = fulcrum::model::Arch::new(&a.model);
        arch.params()
            .iter()
            .flat_map(|p| {
                a.weight(&p.name)
                    .unwrap()
                    .iter()
                    .zip(b.weight(&p.name).unwrap())
            })
            .map(|(x, y)| f64::from(x - y).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let (to_base, to_initial) = (distance(&c, &base), distance(&c, &initial));
    assert!(
        to_base * 10.0 < to_initial,
        "{to_base} from the base, {to_initial} from scratch"
    );
    let scratch = recipe_run("scratch", &["--from-scratch"]);
    scratch.expect(0);
    assert!(
        !scratch.stdout.contains("built-in base"),
        "{}",
        scratch.stdout
    );
    let c = fulcrum::model::Checkpoint::load(&cwd.join("scratch/last.safetensors")).unwrap();
    let (to_base, to_initial) = (distance(&c, &base), distance(&c, &initial));
    assert!(
        to_initial * 10.0 < to_base,
        "{to_base} from the base, {to_initial} from scratch"
    );
    let alone = fulcrum(cwd, &["train", "--data", "d", "--from-scratch"]);
    alone.expect(2);
    assert_mentions(&alone.stderr, &["--from-scratch", "--recipe"]);
    let unknown = fulcrum(cwd, &["train", "--data", "d", "--recipe", "fast"]);
    unknown.expect(2);
    assert_mentions(&unknown.stderr, &["unknown recipe \"fast\"", "photos"]);
    let bad = fulcrum(cwd, &["train", "--data", "d", "--mosaic", "2"]);
    bad.expect(2);
    assert_mentions(&bad.stderr, &["\"2\" is not a probability from 0 to 1"]);
    let bad = fulcrum(cwd, &["train", "--data", "d", "--clip-norm", "2e6"]);
    bad.expect(2);
    assert_mentions(&bad.stderr, &["is not a gradient-norm limit from 0 (off)"]);
    let bad = fulcrum(cwd, &["train", "--data", "d", "--neighbours", "1"]);
    bad.expect(2);
    assert_mentions(
        &bad.stderr,
        &["\"1\" is not a neighbour weight from 0 (off) to below 1"],
    );
    let bad = fulcrum(cwd, &["train", "--data", "d", "--neighbour-radius", "5"]);
    bad.expect(2);
    assert_mentions(&bad.stderr, &["--neighbour-radius", "1..=4"]);
}

/// Boxes too small for det-m's finest level (stride 8): `pack` and `inspect` show their sizes
/// and `train --recipe photos` says, before it starts, which size to pack at instead.
#[test]
fn small_boxes_are_measured_at_pack_time_and_the_recipe_names_a_larger_size() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let src = cwd.join("tiny");
    std::fs::create_dir_all(src.join("images")).unwrap();
    std::fs::create_dir_all(src.join("labels")).unwrap();
    for (i, photo) in common::coco128_photos().iter().take(4).enumerate() {
        std::fs::copy(photo, src.join(format!("images/{i}.jpg"))).unwrap();
        // Three boxes a tenth of the photo's longer side and one a half: at 128 px the
        // small ones are 12.8 px at most, under two cells of stride 8.
        let labels =
            "0 0.2 0.2 0.1 0.1\n0 0.5 0.5 0.1 0.05\n0 0.8 0.8 0.08 0.1\n0 0.5 0.5 0.5 0.5\n";
        std::fs::write(src.join(format!("labels/{i}.txt")), labels).unwrap();
    }
    let pack = fulcrum(cwd, &["pack", "tiny", "--out", "packed", "--size", "128"]);
    pack.expect(0);
    assert_mentions(&pack.stdout, &["box sizes at 128 px", "75 % under 16 px"]);
    let inspect = fulcrum(cwd, &["inspect", "packed"]);
    inspect.expect(0);
    assert_mentions(&inspect.stdout, &["box sizes: longer side", "(quartiles)"]);
    let train = fulcrum(
        cwd,
        &[
            "train",
            "--data",
            "packed",
            "--out",
            "run",
            "--recipe",
            "photos",
            "--batch",
            "4",
            "--max-steps",
            "1",
        ],
    );
    train.expect(0);
    assert_mentions(
        &train.stderr,
        &[
            "75 % of the boxes are under 16 px",
            "stride 8",
            "pack at --size",
        ],
    );
    // Without the recipe nothing is said (a person who set the model chose it).
    let plain = fulcrum(
        cwd,
        &[
            "train",
            "--data",
            "packed",
            "--out",
            "run2",
            "--batch",
            "4",
            "--max-steps",
            "1",
        ],
    );
    plain.expect(0);
    assert!(!plain.stderr.contains("pack at --size"), "{}", plain.stderr);
}

/// `train --init-from W --freeze backbone`: the stem and blocks come out bit for bit as W's
/// weights went in, the checkpoint holds no optimizer state or average for them (and does for
/// the rest), the run says what freezing saves, and `--resume` continues it.
#[test]
fn a_frozen_backbone_stays_as_it_was_and_keeps_no_state() {
    use fulcrum::model::Checkpoint;
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    fulcrum(cwd, &["pack", "--synthetic", "64", "--out", "D"]).expect(0);
    let train = |args: &[&str]| {
        let mut all = vec!["train", "--data", "D", "--batch", "8"];
        all.extend_from_slice(args);
        fulcrum(cwd, &all)
    };
    train(&["--out", "base", "--epochs", "1"]).expect(0);
    let run = train(&[
        "--out",
        "ft",
        "--init-from",
        "base/last.safetensors",
        "--freeze",
        "backbone",
        "--epochs",
        "2",
        "--max-steps",
        "10",
    ]);
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &[
            "frozen (backbone):",
            "parameter tensors",
            "training every layer",
        ],
    );
    let base = Checkpoint::load(&cwd.join("base/last.safetensors")).unwrap();
    let tuned = Checkpoint::load(&cwd.join("ft/last.safetensors")).unwrap();
    let (mut frozen, mut trained) = (0, 0);
    for (name, _, values) in &tuned.tensors {
        let Some(param) = ["adam.m.", "adam.v.", "ema."]
            .iter()
            .find_map(|p| name.strip_prefix(p))
        else {
            continue;
        };
        assert!(
            !param.starts_with("stem") && !param.starts_with('b'),
            "{name} saved"
        );
        trained += usize::from(name.starts_with("ema.") && !values.is_empty());
    }
    for (name, _, values) in &tuned.tensors {
        if name.starts_with("stem") || name.starts_with('b') {
            frozen += 1;
            // --init-from starts from the base's weight average.
            assert_eq!(Some(values.as_slice()), base.weight(name), "{name} moved");
        }
    }
    assert!(
        frozen >= 10 && trained >= 5,
        "{frozen} frozen, {trained} trained"
    );
    // Resuming a frozen run keeps it frozen; changing what is frozen is refused.
    train(&[
        "--out", "ft", "--resume", "--freeze", "backbone", "--epochs", "2",
    ])
    .expect(0);
    let other = train(&[
        "--out", "ft", "--resume", "--freeze", "none", "--epochs", "3",
    ]);
    other.expect(2);
    assert_mentions(&other.stderr, &["freeze"]);
    // A wrong choice names the right ones.
    let bad = train(&["--out", "x", "--epochs", "1", "--freeze", "heads"]);
    bad.expect(2);
    assert_mentions(
        &bad.stderr,
        &["heads", "none, early, backbone or backbone+neck"],
    );
}

/// In `cwd`: the synthetic set packed as D (classes disc, square) and a det-s trained on it
/// into base/, and `photos` coco128 photos labelled with one box each, alternately class 0 and
/// 1 of `classes` (classes.txt's text), packed at 128 as P.
fn base_and_photos(cwd: &Path, photos: usize, classes: &str) {
    fulcrum(cwd, &["pack", "--synthetic", "32", "--out", "D"]).expect(0);
    let base = &[
        "train", "--data", "D", "--out", "base", "--batch", "8", "--epochs", "1",
    ];
    fulcrum(cwd, base).expect(0);
    let src = cwd.join("photos");
    std::fs::create_dir_all(src.join("images")).unwrap();
    std::fs::create_dir_all(src.join("labels")).unwrap();
    for (i, photo) in common::coco128_photos().iter().take(photos).enumerate() {
        std::fs::copy(photo, src.join(format!("images/{i}.jpg"))).unwrap();
        let label = format!("{} 0.5 0.5 0.3 0.4\n", i % 2);
        std::fs::write(src.join(format!("labels/{i}.txt")), label).unwrap();
    }
    std::fs::write(src.join("classes.txt"), classes).unwrap();
    fulcrum(cwd, &["pack", "photos", "--out", "P", "--size", "128"]).expect(0);
}

/// `--init-from` weights of other class names: the classes are matched by name, and the run
/// says which it kept, which are new and which the data does not have.
#[test]
fn fine_tuning_onto_other_class_names_says_what_it_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    base_and_photos(cwd, 8, "square\nraccoon\n");
    let run = fulcrum(
        cwd,
        &[
            "train",
            "--data",
            "P",
            "--out",
            "tuned",
            "--init-from",
            "base/last.safetensors",
            "--batch",
            "8",
            "--epochs",
            "1",
        ],
    );
    run.expect(0);
    assert_mentions(
        &run.stderr,
        &[
            "kept 1 (square)",
            "new, from initial weights: 1 (raccoon)",
            "dropped: 1 (disc)",
        ],
    );
    let tuned = fulcrum::model::Checkpoint::load(&cwd.join("tuned/last.safetensors")).unwrap();
    assert_eq!(tuned.classes, ["square", "raccoon"]);
}

#[test]
fn replay_mixes_the_base_data_in_trains_both_class_sets_and_eval_scores_either() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    base_and_photos(cwd, 12, "raccoon\nsquare\n");
    let tune = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--data",
            "P",
            "--out",
            out,
            "--init-from",
            "base/last.safetensors",
            "--batch",
            "8",
            "--epochs",
            "2",
        ];
        args.extend_from_slice(extra);
        fulcrum(cwd, &args)
    };
    let run = tune("tuned", &["--replay", "D", "--replay-fraction", "0.5"]);
    run.expect(0);
    // 12 photos at 4 a batch make 3 steps an epoch.
    assert_mentions(
        &run.stdout,
        &[
            "replay: 4 of every 8 records from D (32 records, 1 classes the data lacks",
            "3 steps per epoch",
        ],
    );
    assert_mentions(
        &run.stderr,
        &[
            "kept 2 (square, disc)",
            "new, from initial weights: 1 (raccoon)",
        ],
    );
    let tuned = fulcrum::model::Checkpoint::load(&cwd.join("tuned/last.safetensors")).unwrap();
    assert_eq!(tuned.classes, ["raccoon", "square", "disc"]);
    assert_eq!(tuned.model.classes, 3);
    // The run's options stay with it: --resume without --replay is refused.
    let again = fulcrum(
        cwd,
        &[
            "train", "--data", "P", "--out", "tuned", "--resume", "--epochs", "3",
        ],
    );
    again.expect(2);
    assert_mentions(&again.stderr, &["replay: was \"D\", now null"]);

    // Either dataset is scored with the three-class model, by class name.
    for data in ["D", "P"] {
        let eval = fulcrum(
            cwd,
            &[
                "eval",
                "--engine",
                "cpu",
                "--weights",
                "tuned/last.safetensors",
                "--data",
                data,
            ],
        );
        eval.expect(0);
        assert_mentions(&eval.stderr, &["matched by name"]);
    }

    // Bad choices are clear errors.
    let e = tune("bad1", &["--replay", "D", "--replay-fraction", "1"]);
    e.expect(2);
    assert_mentions(&e.stderr, &["above 0 and below 1"]);
    let e = tune("bad2", &["--replay-fraction", "0.3"]);
    e.expect(2);
    assert_mentions(&e.stderr, &["--replay"]);
    fulcrum(
        cwd,
        &["pack", "--synthetic", "16", "--size", "64", "--out", "D64"],
    )
    .expect(0);
    let e = tune("bad3", &["--replay", "D64"]);
    e.expect(2);
    assert_mentions(&e.stderr, &["pack the replay data again with --size 128"]);
}

#[test]
fn max_time_stops_a_long_run_with_its_checkpoint_and_resume_continues() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    fulcrum(cwd, &["pack", "--synthetic", "64", "--out", "D"]).expect(0);
    let train = |limit: &str, resume: bool| {
        let mut args = vec![
            "train",
            "--data",
            "D",
            "--out",
            "run",
            "--batch",
            "8",
            "--epochs",
            "100000",
            "--max-time",
            limit,
        ];
        if resume {
            args.push("--resume");
        }
        fulcrum(cwd, &args)
    };
    let started = std::time::Instant::now();
    train("2s", false).expect(0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "a 2 s limit took {:?}",
        started.elapsed()
    );
    let first = fulcrum::model::Checkpoint::load(&cwd.join("run/last.safetensors")).unwrap();
    assert!(first.progress.step > 0 && first.progress.step < 800_000);
    let again = train("1s", true);
    again.expect(0);
    let second = fulcrum::model::Checkpoint::load(&cwd.join("run/last.safetensors")).unwrap();
    assert!(second.progress.step > first.progress.step);
}
