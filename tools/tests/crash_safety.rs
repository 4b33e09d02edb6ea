//! Training killed with SIGKILL at many moments, some of them inside checkpoint writes (held
//! open by the `FULCRUM_FAULT_SLOW_RENAME_MS` fault-injection variable): after each kill the
//! checkpoint loads and `--resume` goes on, and the run still ends where it should. Also: a
//! second trainer on the same `--out` is refused while the first runs.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fulcrum::model::Checkpoint;

mod common;

use common::{pack_synthetic, BIN};
const TIMEOUT: Duration = Duration::from_secs(120);

/// `fulcrum train` on `data` into `out`, 6 epochs of 8 steps, a checkpoint every epoch.
fn train(data: &Path, out: &Path, resume: bool, slow_rename_ms: u64) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args(["train", "--engine", "cpu", "--threads", "1", "--batch", "8"])
        .args(["--epochs", "6", "--loaders", "1", "--data"])
        .arg(data)
        .arg("--out")
        .arg(out)
        .env("FULCRUM_FAULT_SLOW_RENAME_MS", slow_rename_ms.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out.with_extension("stderr")).unwrap());
    if resume {
        cmd.arg("--resume");
    }
    cmd.spawn().expect("start fulcrum train")
}

fn stderr_of(out: &Path) -> String {
    std::fs::read_to_string(out.with_extension("stderr")).unwrap_or_default()
}

/// A tiny deterministic generator: the kill moments are the same every run.
fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn sigkill_at_any_moment_leaves_a_checkpoint_that_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "64");
    let out = dir.path().join("run");
    let checkpoint = out.join("last.safetensors");
    let tmp = out.join("last.safetensors.fulcrum-tmp");
    let mut rng = 7u64;
    let (mut kills, mut inside_writes, mut last_step) = (0, 0, 0u64);
    for _ in 0..60 {
        if kills == 14 {
            break;
        }
        // Each checkpoint waits 300 ms before its rename: a good share of the run's time is
        // inside a write, even on a loaded machine where the steps are slower.
        let mut child = train(&data, &out, checkpoint.exists(), 300);
        // Every third kill waits for a checkpoint's temporary file to appear and lands while
        // it waits to be renamed: on a loaded machine, where the steps are slow, the timed
        // kills alone may never hit a write. The others kill at a moment from 0.05 to 1.55 s
        // in: before the first step, mid-step, or inside a write.
        let at = if kills % 3 == 1 {
            let started = Instant::now();
            while !tmp.exists() && child.try_wait().unwrap().is_none() {
                assert!(started.elapsed() < TIMEOUT, "{}", stderr_of(&out));
                std::thread::sleep(Duration::from_millis(2));
            }
            started.elapsed()
        } else {
            let at = Duration::from_millis(50 + next(&mut rng) % 1500);
            std::thread::sleep(at);
            at
        };
        if child.try_wait().unwrap().is_some() {
            // It finished before the kill: the run is complete.
            break;
        }
        let writing = tmp.exists();
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        if writing && tmp.exists() {
            inside_writes += 1;
        }
        if checkpoint.exists() {
            let c = Checkpoint::load(&checkpoint).unwrap_or_else(|e| {
                panic!("kill {kills} at {at:?} left a checkpoint that does not load: {e}")
            });
            assert!(
                c.progress.step >= last_step,
                "the checkpoint went back from step {last_step} to {}",
                c.progress.step
            );
            last_step = c.progress.step;
        }
    }
    eprintln!("{kills} kills, {inside_writes} of them inside a checkpoint write");
    assert!(
        kills >= 5,
        "only {kills} kills landed before the run finished"
    );
    assert!(
        inside_writes >= 1,
        "no kill landed inside a checkpoint write ({kills} kills)"
    );
    // Resumed without kills, it ends at the run's last step.
    let saved_before = Checkpoint::load(&checkpoint).map_or(0, |c| c.progress.step);
    let mut child = train(&data, &out, checkpoint.exists(), 0);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < TIMEOUT, "{}", stderr_of(&out));
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = stderr_of(&out);
    assert!(!log.contains("panicked"), "{log}");
    if saved_before == 6 * 8 {
        // The run was already whole (a kill landed after its last checkpoint, or it finished
        // before one): resuming says so.
        assert_eq!(status.code(), Some(2), "{log}");
        assert!(log.contains("already finished"), "{log}");
    } else {
        assert!(status.success(), "{log}");
    }
    let c = Checkpoint::load(&checkpoint).unwrap();
    assert_eq!(c.progress.step, 6 * 8, "{log}");
    assert!(!tmp.exists(), "a finished run leaves no temporary file");
}

#[test]
fn a_second_trainer_on_the_same_out_is_refused_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "64");
    let out = dir.path().join("run");
    // Slow checkpoint writes keep the first run going for a few seconds.
    let mut first = train(&data, &out, false, 1000);
    let lock = out.join(".lock");
    let started = Instant::now();
    while std::fs::read_to_string(&lock).map_or(true, |s| s.trim().is_empty()) {
        assert!(started.elapsed() < TIMEOUT, "{}", stderr_of(&out));
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = Command::new(BIN)
        .args([
            "train", "--engine", "cpu", "--epochs", "1", "--resume", "--data",
        ])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{text}");
    assert!(
        text.contains("in use by another training run")
            && text.contains(&format!("pid {}", first.id())),
        "{text}"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    // The kernel dropped the dead run's lock: the folder can be resumed.
    let mut again = train(
        &data,
        &out,
        Checkpoint::load(&out.join("last.safetensors")).is_ok(),
        0,
    );
    let status = again.wait().unwrap();
    assert!(status.success(), "{}", stderr_of(&out));
}
