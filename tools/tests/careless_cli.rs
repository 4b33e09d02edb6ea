//! The CLI against careless operators (issue 51): stdout that cannot be written, numbers out of
//! their range, batches and thread counts past what works, images that are not read, and
//! evaluation on data whose classes are not the model's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::{assert_mentions, fulcrum, pack_synthetic, Run, BIN};

/// `fulcrum ARGS` in `cwd` with stdout on /dev/full (every write fails with ENOSPC).
fn fulcrum_into_dev_full(cwd: &Path, args: &[&str]) -> Run {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("FULCRUM_LOG")
        .stdin(Stdio::null())
        .stdout(full)
        .output()
        .unwrap();
    Run {
        status: out.status,
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn a_failed_write_to_stdout_is_an_error_naming_stdout_not_a_panic() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    let data = pack_synthetic(cwd, "8");
    let data = data.to_str().unwrap();
    for args in [
        vec!["inspect", data],
        vec!["board"],
        vec!["pack", "--synthetic", "8", "--out", "packed"],
    ] {
        let run = fulcrum_into_dev_full(cwd, &args);
        run.expect(1);
        assert_mentions(&run.stderr, &["stdout", "No space left"]);
    }
    // The pack's real work was done all the same.
    assert!(cwd.join("packed/manifest.json").is_file());
}

#[test]
fn a_reader_that_went_away_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let data = pack_synthetic(t.path(), "8");
    for args in [
        vec!["inspect", data.to_str().unwrap()],
        vec!["board", "pi4"],
    ] {
        let mut child = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before the child has printed anything (it is still starting).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || out.status.signal() == Some(13),
            "{:?}: {stderr}",
            out.status
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("error"),
            "{stderr}"
        );
    }
}

#[test]
fn a_learning_rate_out_of_range_is_refused_before_training() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    let data = pack_synthetic(cwd, "8");
    let data = data.to_str().unwrap();
    for lr in ["-1", "nan", "inf", "0", "1e6"] {
        let lr = format!("--lr={lr}");
        let run = fulcrum(cwd, &["train", "--data", data, &lr, "--out", "run"]);
        run.expect(2);
        assert_mentions(&run.stderr, &["--lr", "above 0 and at most 10"]);
        assert!(!cwd.join("run").exists(), "{lr}: training started");
    }
    // Other numbers of other commands, each refused naming its option.
    for (args, option) in [
        (
            vec!["train", "--data", data, "--weight-decay=-1"],
            "--weight-decay",
        ),
        (vec!["train", "--data", data, "--batch", "0"], "--batch"),
        (vec!["train", "--data", data, "--ring", "0"], "--ring"),
        (
            vec!["train", "--data", data, "--checkpoint-every", "0"],
            "--checkpoint-every",
        ),
        (
            vec!["eval", "--weights", "w", "--data", data, "--iou", "2"],
            "--iou",
        ),
        (
            vec!["eval", "--weights", "w", "--data", data, "--nms", "nan"],
            "--nms",
        ),
        (
            vec!["infer", "--weights", "w", "x.png", "--threshold", "1.5"],
            "--threshold",
        ),
        (
            vec!["infer", "--weights", "w", "x.png", "--top-k", "0"],
            "--top-k",
        ),
        (vec!["pack", "--synthetic", "0"], "--synthetic"),
        (
            vec!["pack", "--synthetic", "8", "--max-boxes", "0"],
            "--max-boxes",
        ),
        (
            vec!["pack", "src", "--holdout", "1", "--holdout-out", "v"],
            "--holdout",
        ),
        (vec!["load", data, "--batch", "0"], "--batch"),
        (
            vec![
                "balance", "--tg", "1ms", "--cores", "1", "--batch", "0", "--step", "1ms",
            ],
            "--batch",
        ),
        (vec!["bench", "compute", "--batch", "0"], "--batch"),
        // Biases training needs frozen layers (the daemon would refuse it minutes in).
        (
            vec!["bench", "serve", "--fine-tune-train-biases"],
            "--fine-tune-freeze early, backbone",
        ),
    ] {
        let run = fulcrum(cwd, &args);
        run.expect(2);
        assert_mentions(&run.stderr, &[option]);
    }
}

#[test]
fn a_batch_past_the_kernels_indexing_is_refused_naming_one_that_works() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    // At 640 px a det-s batch of 5000 would need buffers of over 2³² elements.
    fulcrum(
        cwd,
        &["pack", "--synthetic", "4", "--size", "640", "--out", "big"],
    )
    .expect(0);
    let run = fulcrum(
        cwd,
        &["train", "--data", "big", "--batch", "5000", "--out", "run"],
    );
    run.expect(2);
    assert_mentions(&run.stderr, &["batch 5000 is too large", "--batch"]);
    let best: u32 = run
        .stderr
        .split("the largest batch that works is ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no largest batch in:\n{}", run.stderr));
    assert!((1..5000).contains(&best), "{best}");
    // Past any board's memory: refused at parsing, naming the range.
    let run = fulcrum(cwd, &["train", "--data", "big", "--batch", "100000"]);
    run.expect(2);
    assert_mentions(&run.stderr, &["--batch", "1 to 65536"]);
}

#[test]
fn thread_counts_are_bounded_and_more_than_the_cores_warned_about() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    let data = pack_synthetic(cwd, "8");
    let data = data.to_str().unwrap();
    let run = fulcrum(cwd, &["train", "--data", data, "--threads", "10000"]);
    run.expect(2);
    assert_mentions(&run.stderr, &["--threads", "from 1 to 16"]);
    assert!(!cwd.join("runs").exists(), "training started");

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 16 {
        let run = fulcrum(
            cwd,
            &[
                "train",
                "--data",
                data,
                "--threads",
                "16",
                "--engine",
                "cpu",
                "--batch",
                "4",
                "--max-steps",
                "1",
                "--out",
                "run",
            ],
        );
        run.expect(0);
        assert_mentions(&run.stderr, &["--threads 16 is more than the", "slower"]);
    }
}

/// A minimal valid GIF89a: one 1×1 frame.
const GIF: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00\
    !\xf9\x04\x00\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";

/// A YOLO folder (images/ + labels/) with `n` coco128 photos, each labelled with one box of
/// class 0 and one of class 1, and `classes.txt` listing `classes`.
fn yolo_folder(dir: &Path, n: usize, classes: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("images")).unwrap();
    std::fs::create_dir_all(dir.join("labels")).unwrap();
    let jpgs = common::coco128_photos();
    for (i, jpg) in jpgs.iter().take(n).enumerate() {
        std::fs::copy(jpg, dir.join(format!("images/p{i}.jpg"))).unwrap();
        std::fs::write(
            dir.join(format!("labels/p{i}.txt")),
            "0 0.3 0.3 0.2 0.2\n1 0.7 0.7 0.3 0.3\n",
        )
        .unwrap();
    }
    std::fs::write(dir.join("classes.txt"), classes).unwrap();
    dir.to_owned()
}

#[test]
fn pack_names_a_gif_it_skips_and_does_not_call_its_label_orphaned() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    let src = yolo_folder(&cwd.join("src"), 3, "cat\ndog\n");
    std::fs::write(src.join("images/anim.gif"), GIF).unwrap();
    std::fs::write(src.join("labels/anim.txt"), "0 0.5 0.5 0.5 0.5\n").unwrap();
    let run = fulcrum(cwd, &["pack", "src", "--out", "packed"]);
    run.expect(0);
    assert_mentions(&run.stdout, &["3 records"]);
    assert_mentions(&run.stderr, &["anim.gif", "Gif", "convert it to PNG"]);
    assert!(
        !run.both().contains("label file without an image") && !run.both().contains("anim.txt"),
        "{}",
        run.both()
    );
}

#[test]
fn eval_matches_classes_by_name_and_refuses_unknown_ones_unless_told_to_score_by_position() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    yolo_folder(&cwd.join("ab"), 4, "cat\ndog\n");
    yolo_folder(&cwd.join("ba"), 4, "dog\ncat\n");
    yolo_folder(&cwd.join("other"), 4, "car\nbus\n");
    for name in ["ab", "ba", "other"] {
        let out = format!("{name}-data");
        fulcrum(cwd, &["pack", name, "--out", &out]).expect(0);
    }
    fulcrum(
        cwd,
        &[
            "train",
            "--data",
            "ab-data",
            "--batch",
            "2",
            "--max-steps",
            "1",
            "--out",
            "run",
        ],
    )
    .expect(0);
    let weights = "run/last.safetensors";
    // Another order of the same names: matched by name.
    let run = fulcrum(cwd, &["eval", "--weights", weights, "--data", "ba-data"]);
    run.expect(0);
    assert_mentions(&run.stderr, &["matched by name"]);
    assert_mentions(&run.stdout, &["AP@0.5"]);
    let data = "other-data";
    let run = fulcrum(cwd, &["eval", "--weights", weights, "--data", data]);
    assert_eq!(run.code(), Some(2), "{}", run.both());
    assert_mentions(&run.stderr, &["[cat, dog]", "--classes-by-position"]);
    assert!(run.stdout.is_empty(), "scored anyway:\n{}", run.stdout);
    let run = fulcrum(
        cwd,
        &[
            "eval",
            "--weights",
            weights,
            "--data",
            data,
            "--classes-by-position",
        ],
    );
    run.expect(0);
    assert_mentions(&run.stdout, &["AP@0.5"]);
    assert_mentions(
        &fulcrum(cwd, &["eval", "--weights", weights, "--data", "other-data"]).stderr,
        &["[car, bus]"],
    );
    fulcrum(cwd, &["eval", "--weights", weights, "--data", "ab-data"]).expect(0);
}
