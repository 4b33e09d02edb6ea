//! Full disks, for real: each test mounts a 1 MiB tmpfs (which needs root) and fills it
//! during `pack`, a checkpoint, `export` and a trace. Each must fail with a clear "no space"
//! error naming the file, keep the previous file intact and leave no temporary file behind.
//! Without root the tests say SKIP, unless `FULCRUM_REQUIRE_TMPFS=1` (CI), where that fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use fulcrum::model::Checkpoint;

mod common;

use common::{pack_synthetic, BIN};

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path) -> Option<Tmpfs> {
        let path = dir.join("disk");
        std::fs::create_dir_all(&path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs"])
            .arg(&path)
            .stderr(Stdio::piped())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { path }),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                    Err(e) => e.to_string(),
                };
                if std::env::var("FULCRUM_REQUIRE_TMPFS").is_ok_and(|v| v == "1") {
                    panic!("FULCRUM_REQUIRE_TMPFS=1 but a tmpfs cannot be mounted: {why}");
                }
                eprintln!("SKIP: cannot mount a tmpfs (needs root): {why}");
                None
            }
        }
    }

    /// Fills the disk but for about `leave` bytes.
    fn fill_but(&self, leave: u64) {
        let filler = self.path.join("filler");
        let chunk = vec![7u8; 4096];
        let mut f = std::fs::File::create(&filler).unwrap();
        let mut written = 0u64;
        while std::io::Write::write_all(&mut f, &chunk).is_ok() {
            written += chunk.len() as u64;
        }
        drop(f);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&filler)
            .unwrap()
            .set_len(written.saturating_sub(leave))
            .unwrap();
    }

    /// What is on the disk besides `keep`.
    fn others(&self, keep: &[&str]) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !keep.contains(&n.as_str()))
            .collect();
        names.sort();
        names
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

fn fulcrum(args: &[&str], paths: &[&Path]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null());
    for p in paths {
        cmd.arg(p);
    }
    cmd.output().unwrap()
}

#[track_caller]
fn assert_no_space(out: &Output, names: &str) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.to_lowercase().contains("no space") && text.contains(names),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    text
}

#[test]
fn pack_onto_a_full_disk_fails_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = Tmpfs::mount(dir.path()) else {
        return;
    };
    // 64 records of 48 KiB do not fit in 1 MiB.
    let out = fulcrum(
        &["pack", "--synthetic", "64", "--out"],
        &[&disk.path.join("data")],
    );
    assert_no_space(&out, "data");
    assert_eq!(disk.others(&[]), Vec::<String>::new());
}

#[test]
fn a_checkpoint_onto_a_full_disk_fails_and_keeps_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "64");
    let Some(disk) = Tmpfs::mount(dir.path()) else {
        return;
    };
    // The first checkpoint (650 KiB) fits; the second needs as much again beside it.
    let run = disk.path.join("run");
    let out = fulcrum(
        &[
            "train", "--engine", "cpu", "--batch", "8", "--epochs", "3", "--data",
        ],
        &[&data, Path::new("--out"), &run],
    );
    assert_no_space(&out, "last.safetensors");
    let c = Checkpoint::load(&run.join("last.safetensors")).expect("the previous checkpoint");
    assert_eq!(c.progress.step, 8, "the first epoch's checkpoint");
    assert!(!run.join("last.safetensors.fulcrum-tmp").exists());
}

#[test]
fn export_and_trace_onto_a_full_disk_fail_and_keep_what_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "64");
    let run = dir.path().join("run");
    let out = fulcrum(
        &[
            "train", "--engine", "cpu", "--batch", "8", "--epochs", "1", "--data",
        ],
        &[&data, Path::new("--out"), &run],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let weights = run.join("last.safetensors");
    let Some(disk) = Tmpfs::mount(dir.path()) else {
        return;
    };
    let onnx = disk.path.join("model.onnx");
    let out = fulcrum(
        &["export", "--weights"],
        &[&weights, Path::new("--onnx"), &onnx],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read(&onnx).unwrap();
    disk.fill_but(16 << 10);
    let out = fulcrum(
        &["export", "--weights"],
        &[&weights, Path::new("--onnx"), &onnx],
    );
    assert_no_space(&out, "model.onnx");
    assert_eq!(std::fs::read(&onnx).unwrap(), before, "the previous export");
    assert_eq!(disk.others(&["model.onnx", "filler"]), Vec::<String>::new());

    disk.fill_but(0);
    let trace = disk.path.join("trace.json");
    let out = fulcrum(
        &[
            "train",
            "--engine",
            "cpu",
            "--batch",
            "8",
            "--epochs",
            "1",
            "--max-steps",
            "2",
            "--data",
        ],
        &[
            &data,
            Path::new("--out"),
            &dir.path().join("run2"),
            Path::new("--trace"),
            &trace,
        ],
    );
    assert_no_space(&out, "trace.json");
    assert_eq!(disk.others(&["model.onnx", "filler"]), Vec::<String>::new());
}
