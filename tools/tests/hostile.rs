//! Hostile input wherever it enters: every option of every command given absurd values, and
//! datasets that other processes are writing or reading. Each case must work or end with a
//! short, clear error (exit 1 or 2); never a panic, an abort, a hang or megabytes of message.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{
    assert_mentions, fulcrum, pack_synthetic, run_bin, Outcome, BENCH_BIN, BIN, DAEMON_BIN,
};

/// Values no option expects: zero, negative, not a number, infinite, past every float and
/// integer type, empty, and a 100 kB token.
fn absurd_values() -> Vec<String> {
    [
        "0",
        "-1",
        "nan",
        "inf",
        "1e300",
        "99999999999999999999",
        "4294967297",
        "",
    ]
    .iter()
    .map(|v| v.to_string())
    .chain(std::iter::once("9".repeat(100_000)))
    .collect()
}

/// Paths that are not what an option expects, made in each run's folder by [`make_odd_paths`]:
/// a file, a folder, a link to itself, and a path through a file.
const ODD_PATHS: [&str; 4] = ["a-file", "a-folder", "loop", "a-file/below"];

fn make_odd_paths(dir: &Path) {
    std::fs::write(dir.join("a-file"), "not what you expect\n").unwrap();
    std::fs::create_dir(dir.join("a-folder")).unwrap();
    std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
}

/// The options that take a value, as `BIN SUB --help` lists them, each with whether the value
/// is a path: every option the parser knows, so that a new one is covered without touching
/// this test.
fn value_options(bin: &str, sub: &[&str]) -> Vec<(String, bool)> {
    const PATH_VALUES: [&str; 11] = [
        "<FILE>",
        "<DIR>",
        "<DATA>",
        "<CHECKPOINT>",
        "<WEIGHTS>",
        "<SOCKET>",
        "<PNG>",
        "<OUT>",
        "<OUT.onnx>",
        "<JSON>",
        "<STATE_DIR>",
    ];
    let out = Command::new(bin).args(sub).arg("--help").output().unwrap();
    assert!(out.status.success(), "{bin} {sub:?} --help");
    let mut options: Vec<(String, bool)> = Vec::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue;
        }
        // `-o, --out <OUT>`, `--holdout-out [<DIR>]`, `--mem-budget <MEM_BUDGET>`
        let mut words = line.split_whitespace().skip_while(|w| !w.starts_with("--"));
        let Some(long) = words.next() else {
            continue;
        };
        let Some(value) = words
            .next()
            .filter(|v| v.starts_with('<') || v.starts_with("[<"))
        else {
            continue;
        };
        let value = value.trim_start_matches('[').trim_end_matches(']');
        let option = long.trim_end_matches(',').to_owned();
        if options.last().is_none_or(|(last, _)| *last != option) {
            options.push((option, PATH_VALUES.contains(&value)));
        }
    }
    options
}

/// One command line that works, whose options the matrix replaces one at a time.
struct Base {
    bin: &'static str,
    /// Subcommand words (their `--help` lists the options).
    sub: &'static [&'static str],
    args: Vec<String>,
    /// A daemon: "serving" on stderr means it started, and it is stopped there.
    ready: Option<&'static str>,
}

/// `args` without `option` and its value (when the base gives it).
fn without(args: &[String], option: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == option {
            skip = true;
        } else {
            out.push(a.clone());
        }
    }
    out
}

/// What is wrong with how one run ended, if anything.
fn judge(outcome: &Outcome, ready: Option<&str>) -> Option<String> {
    let stderr = match outcome {
        Outcome::Ready(_) if ready.is_some() => return None,
        Outcome::Ready(stderr) => return Some(format!("unexpected ready: {stderr}")),
        Outcome::TimedOut(stderr) => return Some(format!("hang; stderr so far:\n{stderr}")),
        Outcome::Exited(run) => {
            // 0: it worked; 1: it ran and found the input bad (an unreadable image, a bad
            // record: documented); 2: refused. A panic is 101, a signal no code at all.
            if matches!(run.code(), Some(0..=2)) {
                &run.stderr
            } else {
                return Some(format!("ended with {:?}:\n{}", run.status, run.stderr));
            }
        }
    };
    if let Outcome::Exited(run) = outcome {
        if run.code() != Some(0) && stderr.trim().is_empty() {
            return Some(format!("ended with {:?} and said nothing", run.status));
        }
    }
    if stderr.contains("panicked") {
        return Some(format!("panicked:\n{stderr}"));
    }
    if let Some(long) = stderr.lines().find(|l| l.chars().count() > 400) {
        let cut: String = long.chars().take(200).collect();
        return Some(format!(
            "a line of {} characters (quoted input must be cut): {cut}…",
            long.chars().count()
        ));
    }
    None
}

#[test]
fn every_option_takes_absurd_numbers_without_a_panic_or_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let abs = |p: &Path| p.to_str().unwrap().to_owned();
    let (data, weights) = one_step_checkpoint(root, "64");
    let image = abs(&coco128_image());
    let (data, weights) = (abs(&data), abs(&weights));
    let daemon_socket = root.join("daemon.sock");
    let _daemon = Daemon::start(root, &weights, &daemon_socket);

    let args = |s: &str| -> Vec<String> {
        s.split_whitespace()
            .map(|w| match w {
                "DATA" => data.clone(),
                "WEIGHTS" => weights.clone(),
                "IMAGE" => image.clone(),
                "DAEMON" => abs(&daemon_socket),
                w => w.to_owned(),
            })
            .collect()
    };
    let base = |bin, sub, line: &str| Base {
        bin,
        sub,
        args: args(line),
        ready: None,
    };
    let mut bases = vec![
        base(BIN, &["demo"], "demo --dir demo --images 16 --epochs 1"),
        base(BIN, &["pack"], "pack --synthetic 16 --size 64 --out packed"),
        base(BIN, &["inspect"], "inspect DATA"),
        base(BIN, &["load"], "load DATA --epochs 1 --batch 8"),
        base(
            BIN,
            &["bench", "io"],
            "bench io --data DATA --seconds 0.2 --queue-depth 8 --batch 8",
        ),
        base(
            BIN,
            &["bench", "compute"],
            "bench compute --runs 1 --cpu-only --top 1 --batch 2",
        ),
        base(
            BIN,
            &["bench", "balance"],
            "bench balance --data DATA --steps 2 --batch 8",
        ),
        base(
            BIN,
            &["bench", "serve"],
            "bench serve --weights WEIGHTS --seconds 0.2",
        ),
        base(
            BIN,
            &["balance"],
            "balance --tg 1 --cores 2 --batch 8 --step 10",
        ),
        base(
            BIN,
            &["simulate"],
            "simulate --loaders 2 --seconds 1 --load-ms 5 --step-ms 3",
        ),
        base(
            BIN,
            &["train"],
            "train --data DATA --out out --epochs 1 --max-steps 2 --batch 8",
        ),
        base(
            BIN,
            &["eval"],
            "eval --weights WEIGHTS --data DATA --batch 8",
        ),
        base(BIN, &["infer"], "infer IMAGE --weights WEIGHTS"),
        base(BIN, &["client"], "client --socket DAEMON IMAGE"),
        base(BIN, &["export"], "export --weights WEIGHTS --onnx out.onnx"),
        base(
            BENCH_BIN,
            &[],
            "--quick --data DATA --seconds 0.2 --batch 2 --runs 1 --cool-down 0",
        ),
    ];
    bases.push(Base {
        ready: Some("serving on"),
        ..base(
            DAEMON_BIN,
            &[],
            "--weights WEIGHTS --socket serve.sock --state-dir state",
        )
    });

    // Positional paths (PATH in the line): odd paths and absurd strings in their place.
    let positional = [
        base(BIN, &["inspect"], "inspect PATH"),
        base(BIN, &["load"], "load PATH --epochs 1 --batch 8"),
        base(BIN, &["pack"], "pack PATH --out packed"),
        base(BIN, &["infer"], "infer PATH --weights WEIGHTS"),
        base(BIN, &["client"], "client --socket DAEMON PATH"),
    ];

    let mut runs = Vec::new();
    for base in &positional {
        let odd = ODD_PATHS.iter().map(|p| p.to_string());
        for value in odd.chain(absurd_values()) {
            let args = base.args.iter().map(|a| {
                if a == "PATH" {
                    value.clone()
                } else {
                    a.clone()
                }
            });
            runs.push((base, args.collect()));
        }
    }
    for base in &bases {
        let options = value_options(base.bin, base.sub);
        assert!(
            !options.is_empty() || base.sub == ["board"],
            "{:?}",
            base.sub
        );
        for (option, is_path) in options {
            let odd_paths = ODD_PATHS.iter().filter(|_| is_path).map(|p| p.to_string());
            for value in absurd_values().into_iter().chain(odd_paths) {
                // Device 0 is a real one (lavapipe here): a whole Vulkan run of a debug build
                // takes a minute, and the Vulkan tests cover it.
                if option == "--device" && value == "0" {
                    continue;
                }
                let mut args = without(&base.args, &option);
                args.push(option.clone());
                args.push(value);
                runs.push((base, args));
            }
        }
    }
    assert!(
        runs.len() > 500,
        "only {} runs: the option lists",
        runs.len()
    );

    // Two at a time (each in its own folder): most runs are a process start and an error.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let durations = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for worker in 0..2 {
            let (runs, next, failures, durations) = (&runs, &next, &failures, &durations);
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((base, args)) = runs.get(i) else {
                    break;
                };
                let cwd = root.join(format!("w{worker}-{i}"));
                std::fs::create_dir(&cwd).unwrap();
                make_odd_paths(&cwd);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let timeout = Duration::from_secs(60);
                let started = Instant::now();
                let outcome = run_bin(base.bin, &cwd, &args, &[], timeout, base.ready);
                durations.lock().unwrap().push((started.elapsed(), i));
                if let Some(problem) = judge(&outcome, base.ready) {
                    let shown: Vec<String> = args
                        .iter()
                        .map(|a| fulcrum::text::quoted(a).trim_matches('"').to_owned())
                        .collect();
                    let bin = Path::new(base.bin).file_name().unwrap().to_string_lossy();
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("`{bin} {}`: {problem}", shown.join(" ")));
                }
                let _ = std::fs::remove_dir_all(&cwd);
            });
        }
    });
    // The slowest runs, for whoever makes this test faster (`--nocapture` shows them).
    let mut durations = durations.into_inner().unwrap();
    durations.sort();
    for (took, i) in durations.iter().rev().take(15) {
        eprintln!(
            "{took:>10.2?}  {}",
            runs[*i].1.join(" ").chars().take(160).collect::<String>()
        );
    }
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} runs went wrong:\n\n{}",
        failures.len(),
        runs.len(),
        failures.join("\n\n")
    );
}

/// `ROOT/syn` (N synthetic records) and `ROOT/run/last.safetensors` trained on it for a step.
fn one_step_checkpoint(root: &Path, records: &str) -> (PathBuf, PathBuf) {
    let data = pack_synthetic(root, records);
    let train = "train --data syn --out run --epochs 1 --max-steps 1 --batch 8";
    fulcrum(root, &train.split(' ').collect::<Vec<_>>()).expect(0);
    (data, root.join("run/last.safetensors"))
}

fn coco128_image() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/coco128/images");
    let mut images: Vec<PathBuf> = walk(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    images.sort();
    images
        .into_iter()
        .next()
        .expect("the shared coco128 images (../shared/data beside the checkout)")
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A fulcrumd serving `weights` on `socket` for the client's cases, stopped when dropped.
struct Daemon(Child);

impl Daemon {
    fn start(dir: &Path, weights: &str, socket: &Path) -> Daemon {
        let err = dir.join("daemon.stderr");
        let child = Command::new(DAEMON_BIN)
            .args([
                "--weights",
                weights,
                "--state-dir",
                "daemon-state",
                "--socket",
            ])
            .arg(socket)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let daemon = Daemon(child);
        let started = Instant::now();
        while !std::fs::read_to_string(&err)
            .unwrap_or_default()
            .contains("serving on")
        {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "fulcrumd start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child process stopped (SIGKILL) when dropped, whatever the test's outcome.
struct Running(Child);

impl Running {
    /// `fulcrum ARGS` in `cwd`, stdout and stderr both to `log`.
    fn spawn(cwd: &Path, args: &[&str], log: &Path) -> Running {
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(BIN)
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Running(child)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `ready` every millisecond for up to a minute.
fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn records_of(root: &Path, data: &str) -> String {
    let run = fulcrum(root, &["inspect", data]);
    run.expect(0);
    run.stdout
        .split_whitespace()
        .zip(run.stdout.split_whitespace().skip(1))
        .find(|(_, unit)| unit.starts_with("records"))
        .map(|(n, _)| n.to_owned())
        .unwrap_or_else(|| panic!("no record count in:\n{}", run.stdout))
}

#[test]
fn a_dataset_is_not_replaced_while_read_nor_read_or_packed_twice_while_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    pack_synthetic(root, "64");
    assert_eq!(records_of(root, "syn"), "64");

    // A reader holds it: `pack --force` refuses and leaves it whole.
    let log = root.join("load.log");
    let reader = Running::spawn(
        root,
        &["load", "syn", "--epochs", "1000000", "--batch", "8"],
        &log,
    );
    wait_for("the loader to start", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("planned")
    });
    let refused = fulcrum(
        root,
        &["pack", "--synthetic", "16", "--out", "syn", "--force"],
    );
    refused.expect(2);
    assert_mentions(
        &refused.stderr,
        &["syn is being read by another process", "stop it"],
    );
    drop(reader);
    assert_eq!(records_of(root, "syn"), "64");

    // A pack replacing it, caught mid-write: readers and a second pack are refused.
    let working = root.join("syn.fulcrum-tmp");
    let log = root.join("pack.log");
    let mut writer = Running::spawn(
        root,
        &["pack", "--synthetic", "3000", "--out", "syn", "--force"],
        &log,
    );
    wait_for("the pack to write its first shard", || {
        std::fs::read_dir(&working).is_ok_and(|mut d| d.next().is_some())
    });
    writer.signal(nix::sys::signal::Signal::SIGSTOP);
    let read = fulcrum(root, &["inspect", "syn"]);
    read.expect(2);
    assert_mentions(&read.stderr, &["being written by `fulcrum pack`", "wait"]);
    for out in ["syn", "syn/"] {
        let second = fulcrum(
            root,
            &["pack", "--synthetic", "16", "--out", out, "--force"],
        );
        second.expect(2);
        assert_mentions(&second.stderr, &["being written by another `fulcrum pack`"]);
    }
    writer.signal(nix::sys::signal::Signal::SIGCONT);
    assert!(
        writer.0.wait().unwrap().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(records_of(root, "syn"), "3000");
    assert!(!working.exists());

    // What a killed pack left behind is taken over, not an obstacle.
    std::fs::create_dir(&working).unwrap();
    std::fs::write(working.join("shard-00000.bin"), b"half a shard").unwrap();
    fulcrum(
        root,
        &["pack", "--synthetic", "16", "--out", "syn", "--force"],
    )
    .expect(0);
    assert_eq!(records_of(root, "syn"), "16");
    assert!(!working.exists());
}

/// `fulcrum infer DIR | head -1`: when the reader of its output exits, fulcrum ends as other
/// Unix tools do (SIGPIPE), not with a panic on the failed print.
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    one_step_checkpoint(root, "16");
    let images = coco128_image().parent().unwrap().to_owned();
    let mut child = Command::new(BIN)
        .args(["infer", "--weights", "run/last.safetensors"])
        .arg(&images)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with('{'), "{first}");
    // The reader is dropped here: 127 images' lines are left to write into a closed pipe.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(nix::libc::SIGPIPE),
        "{:?}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
