//! Resource limits as a board or a systemd unit sets them: a virtual-memory limit below the
//! run's plan is refused before anything is allocated (not killed mid-run), a training run's
//! peak resident memory stays within 8 MiB of its plan and it completes inside a cgroup memory
//! limit of the plan + 16 MiB, a zero locked-memory limit still loads data, and no `HOME` with
//! an unwritable cache folder still runs the Vulkan engine (the pipeline cache is only a
//! warning).

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
    let data = pack_synthetic(dir.path(), "128");
    let (data, out) = (data.to_str().unwrap(), dir.path().join("run"));
    let args = [
        "train",
        "--engine",
        "cpu",
        "--batch",
        "128",
        "--max-steps",
        "1",
        "--data",
        data,
        "--out",
        out.to_str().unwrap(),
    ];
    // Batch 128 plans about 280 MiB; 150 MiB of address space is enough to start, not to run.
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
            && !fulcrum::compute::vulkan::testing::required()
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

/// `(peak resident, planned)` in MiB from `fulcrum train`'s closing line, "memory: peak
/// resident X MiB (… planned Y MiB)".
fn peak_and_plan(stdout: &str) -> (f64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("memory: peak resident"))
        .unwrap_or_else(|| panic!("no peak memory line in:\n{stdout}"));
    let mib = |after| common::mib_after(line, after);
    (mib("peak resident"), mib("planned"))
}

/// A memory cgroup of its own (v1, or v2 where the memory controller is there), removed on
/// drop.
struct MemoryCgroup {
    dir: std::path::PathBuf,
    /// The file that holds the group's peak usage: v1's `memory.max_usage_in_bytes`, v2's
    /// `memory.peak` (Linux 5.19 and later).
    peak_file: &'static str,
}

impl MemoryCgroup {
    const V1: &'static str = "/sys/fs/cgroup/memory";
    const V2: &'static str = "/sys/fs/cgroup";

    /// A group limited to `bytes` (swap included), or why there is none here.
    fn new(bytes: u64) -> Result<MemoryCgroup, String> {
        if !nix::unistd::getuid().is_root() {
            return Err("needs root to make a memory cgroup".into());
        }
        let name = format!("fulcrum-test-{}", std::process::id());
        let limit = bytes.to_string();
        let write = |dir: &Path, file: &str, value: &str| {
            std::fs::write(dir.join(file), value).map_err(|e| format!("{file}: {e}"))
        };
        let v1 = Path::new(Self::V1);
        if v1.join("memory.limit_in_bytes").exists() {
            let dir = v1.join(&name);
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let group = MemoryCgroup {
                dir,
                peak_file: "memory.max_usage_in_bytes",
            };
            write(&group.dir, "memory.limit_in_bytes", &limit)?;
            // No swapping out of the limit where the kernel accounts swap.
            if group.dir.join("memory.memsw.limit_in_bytes").exists() {
                write(&group.dir, "memory.memsw.limit_in_bytes", &limit)?;
            }
            return Ok(group);
        }
        // cgroup v2: a child of the root group, with the memory controller handed down to it.
        let v2 = Path::new(Self::V2);
        let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).map_err(|_| {
            format!(
                "no cgroup v1 memory controller at {} and no cgroup v2 at {}",
                Self::V1,
                Self::V2
            )
        })?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(format!(
                "cgroup v2 at {} has no memory controller",
                Self::V2
            ));
        }
        let handed_down =
            std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
        if !handed_down.split_whitespace().any(|c| c == "memory") {
            write(v2, "cgroup.subtree_control", "+memory")?;
        }
        let dir = v2.join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let group = MemoryCgroup {
            dir,
            peak_file: "memory.peak",
        };
        if !group.dir.join("memory.peak").exists() {
            return Err("cgroup v2 without memory.peak (Linux before 5.19)".into());
        }
        write(&group.dir, "memory.max", &limit)?;
        if group.dir.join("memory.swap.max").exists() {
            write(&group.dir, "memory.swap.max", "0")?;
        }
        Ok(group)
    }

    /// The most memory the group used.
    fn peak(&self) -> u64 {
        std::fs::read_to_string(self.dir.join(self.peak_file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// `fulcrum ARGS` inside the group.
    fn run(&self, args: &[&str]) -> Output {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                self.dir.display()
            ))
            .arg(BIN)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn training_memory_follows_its_plan_and_fits_a_cgroup_of_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let data = pack_synthetic(dir.path(), "128");
    let data = data.to_str().unwrap();
    let train = |out: &str| {
        let out = dir.path().join(out);
        let args = ["train", "--batch", "32", "--epochs", "1", "--data", data];
        (args, out)
    };

    // det-s at batch 32, at the default engine (`auto`, which lists the Vulkan devices in a
    // child process and takes the CPU engine here): the plan lists every allocation, and the
    // process's peak resident memory (its code, libraries and stacks included, no Vulkan
    // driver among them) is within 8 MiB of it.
    let (args, out) = train("plain");
    let ran = Command::new(BIN)
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    for item in [
        "ring slots",
        "model: activations and gradients",
        "cpu engine: kernel scratch",
        "checkpoint:",
    ] {
        assert!(stdout.contains(item), "{item:?} not in the plan:\n{stdout}");
    }
    // `--io auto` (the default) reads with io_uring where it can: the plan counts its queues.
    assert_eq!(
        stdout.contains("io_uring queues per loader (kernel)"),
        fulcrum::io::probe_uring().is_ok(),
        "{stdout}"
    );
    let (peak, plan) = peak_and_plan(&stdout);
    assert!(
        (peak - plan).abs() <= 8.0,
        "peak resident {peak} MiB, planned {plan} MiB:\n{stdout}"
    );
    // Issue 12's goal: det-s training at batch 32 within 64 MiB resident (130.5 MiB with a
    // buffer per tensor; PyTorch 877, Keras 690).
    assert!(peak <= 64.0, "peak resident {peak} MiB:\n{stdout}");

    // Inside a cgroup that allows the plan + 16 MiB (page cache of the shards included),
    // the same run completes.
    let limit = ((plan + 16.0) * 1048576.0) as u64;
    let group = match MemoryCgroup::new(limit) {
        Ok(group) => group,
        Err(why) if std::env::var_os("CI").is_some() => panic!("CI must run this: {why}"),
        Err(why) => {
            println!("SKIP the cgroup half: {why}");
            return;
        }
    };
    let (args, out) = train("cgroup");
    let out = out.to_str().unwrap();
    let mut all = args.to_vec();
    all.extend(["--out", out]);
    let ran = group.run(&all);
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "status {:?} within {limit} bytes:\n{stdout}\n{}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(stdout.contains("done at step 4 (epoch"), "{stdout}");
    assert!(stdout.contains(" s, loss "), "the wall time: {stdout}");
    // The run's memory was the group's: its peak reached most of the plan (and the kernel
    // held it to the limit).
    let peak = group.peak();
    assert!(
        peak as f64 >= 0.8 * plan * 1048576.0 && peak <= limit,
        "the group's peak {peak} bytes against a plan of {plan} MiB and a limit of {limit}"
    );
}
