//! Resource limits as a board or a systemd unit sets them: a virtual-memory limit below the
//! run's plan is refused before anything is allocated (not killed mid-run), a zero locked-memory
//! limit still loads data, and no `HOME` with an unwritable cache folder still runs the Vulkan
//! engine (the pipeline cache is only a warning).

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;

use common::{pack_synthetic, BIN};

/// `fulcrum ARGS` under `sh -c 'ulimit …; exec fulcrum …'`.
fn under_ulimit(limit: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {limit} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_plan_over_ulimit_v_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "64");
    let (data, out) = (data.to_str().unwrap(), dir.path().join("run"));
    let args = [
        "train",
        "--engine",
        "cpu",
        "--batch",
        "64",
        "--max-steps",
        "1",
        "--data",
        data,
        "--out",
        out.to_str().unwrap(),
    ];
    // Batch 64 plans about 240 MiB; 150 MiB of address space is enough to start, not to run.
    let refused = under_ulimit("-v 153600", &args);
    let text = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{text}");
    assert!(
        text.contains("ulimit -v") && text.contains("lower --batch") && !text.contains("panicked"),
        "{text}"
    );
    assert!(!out.join("last.safetensors").exists());
    // With room for the plan, the same run works.
    let ran = under_ulimit("-v 1048576", &args);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

#[test]
fn no_locked_memory_still_loads_data_or_says_what_to_raise() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "64");
    let data = data.to_str().unwrap();
    let auto = under_ulimit("-l 0", &["load", data]);
    let text = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{text}");
    assert!(String::from_utf8_lossy(&auto.stdout).contains("delivered 64 records"));
    let uring = under_ulimit("-l 0", &["load", data, "--io", "uring"]);
    let text = String::from_utf8_lossy(&uring.stderr);
    assert!(
        uring.status.success() || text.contains("ulimit -l") || text.contains("LimitMEMLOCK"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
}

#[test]
fn no_home_and_an_unwritable_cache_still_run_vulkan() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "16");
    let run = dir.path().join("run");
    let trained = Command::new(BIN)
        .args([
            "train",
            "--engine",
            "cpu",
            "--batch",
            "8",
            "--max-steps",
            "1",
            "--data",
        ])
        .arg(&data)
        .arg("--out")
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    let image = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/raccoon/images/raccoon-1.jpg");
    for cache in [None, Some("/proc/self/no-cache-here")] {
        let mut cmd = Command::new(BIN);
        cmd.args(["infer", "--engine", "vulkan", "--weights"])
            .arg(run.join("last.safetensors"))
            .arg(&image)
            .env_remove("HOME")
            .env_remove("XDG_CACHE_HOME")
            .stdin(Stdio::null());
        if let Some(c) = cache {
            cmd.env("XDG_CACHE_HOME", c);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            && text.contains("Vulkan")
            && std::env::var("FULCRUM_REQUIRE_VULKAN").map_or(true, |v| v != "1")
        {
            eprintln!("SKIP: no Vulkan device: {text}");
            return;
        }
        assert!(out.status.success(), "cache {cache:?}: {text}");
        assert!(!text.contains("panicked"), "{text}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("\"detections\""),
            "cache {cache:?}"
        );
        if cache.is_some() {
            assert!(text.contains("could not save the pipeline cache"), "{text}");
        }
    }
}
