//! Helpers the integration tests of the binaries share. Each test file uses some of them.
#![allow(dead_code)]

pub mod daemon;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
pub const DAEMON_BIN: &str = env!("CARGO_BIN_EXE_fulcrumd");
pub const BENCH_BIN: &str = env!("CARGO_BIN_EXE_fulcrum-bench");
/// Generous: every command the tests run takes well under a few seconds; more means a hang.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// `fulcrum pack --synthetic N` into `DIR/syn`.
pub fn pack_synthetic(dir: &Path, n: &str) -> PathBuf {
    let data = dir.join("syn");
    let out = Command::new(BIN)
        .args(["pack", "--synthetic", n, "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// How a finished command ended, with its whole output.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn both(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    /// Panics with the whole output unless the exit code is `code` and nothing panicked.
    #[track_caller]
    pub fn expect(&self, code: i32) -> &Self {
        assert!(
            self.code() == Some(code) && !self.stderr.contains("panicked"),
            "expected exit code {code}, got {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code(),
            self.stdout,
            self.stderr
        );
        self
    }
}

/// How a command run by [`run_bin`] ended.
pub enum Outcome {
    Exited(Run),
    /// Its stderr showed the `ready` text (a daemon serving); it was killed then.
    Ready(String),
    /// Still running after the timeout (and killed): the stderr so far.
    TimedOut(String),
}

/// Runs `BIN ARGS` in `cwd` with `env` set (and fulcrum's own variables cleared otherwise),
/// output to files (no pipe can fill up), until it exits, prints `ready` on stderr or runs
/// past `timeout`.
pub fn run_bin(
    bin: &str,
    cwd: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
    ready: Option<&str>,
) -> Outcome {
    let out_path = cwd.join(".fulcrum-test-stdout");
    let err_path = cwd.join(".fulcrum-test-stderr");
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("FULCRUM_FAULT_URING")
        .env_remove("FULCRUM_FAULT_DIRECT")
        .env_remove("FULCRUM_LOG")
        .env_remove("FULCRUM_CPU_KERNELS")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run the binary");
    let started = Instant::now();
    let stderr = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the binary") {
            break status;
        }
        let is_ready = ready.is_some_and(|text| stderr().contains(text));
        if is_ready || started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return if is_ready {
                Outcome::Ready(stderr())
            } else {
                Outcome::TimedOut(stderr())
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Outcome::Exited(Run {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: stderr(),
    })
}

/// `fulcrum ARGS` with `env`, failed after [`TIMEOUT`] as a hang.
pub fn fulcrum_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    match run_bin(BIN, cwd, args, env, TIMEOUT, None) {
        Outcome::Exited(run) => run,
        Outcome::Ready(stderr) | Outcome::TimedOut(stderr) => panic!(
            "`fulcrum {}` did not finish within {TIMEOUT:?} (hang?); stderr so far:\n{stderr}",
            args.join(" ")
        ),
    }
}

pub fn fulcrum(cwd: &Path, args: &[&str]) -> Run {
    fulcrum_env(cwd, args, &[])
}

#[track_caller]
pub fn assert_mentions(text: &str, words: &[&str]) {
    for w in words {
        assert!(text.contains(w), "{w:?} missing from:\n{text}");
    }
}

/// The size printed after the first `after` in `line` ("12.3 MiB", "512.0 KiB"), in MiB: for
/// the memory figures the binaries print.
pub fn mib_after(line: &str, after: &str) -> f64 {
    let text = line
        .split(after)
        .nth(1)
        .unwrap_or_else(|| panic!("no {after:?} in {line}"))
        .trim_start();
    let (value, unit) = text.split_once(' ').unwrap();
    let v: f64 = value.parse().unwrap();
    match unit.get(..3) {
        Some("KiB") => v / 1024.0,
        Some("MiB") => v,
        _ => panic!("unit {unit:?} in {line}"),
    }
}

/// The shared coco128 photos (`../shared/data` beside the checkout), sorted by name.
pub fn coco128_photos() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/coco128/images");
    let mut jpgs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the shared coco128 images (../shared/data beside the checkout)")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    jpgs.sort();
    jpgs
}
