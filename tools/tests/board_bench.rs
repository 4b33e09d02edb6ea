//! `fulcrum-bench`, the board report: its sections, its JSON and the kernel set it names.

mod common;

use common::{assert_mentions, pack_synthetic, run_bin, Outcome, Run, BENCH_BIN, TIMEOUT};
use std::path::Path;

fn bench(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    match run_bin(BENCH_BIN, cwd, args, env, 3 * TIMEOUT, None) {
        Outcome::Exited(run) => run,
        Outcome::Ready(e) | Outcome::TimedOut(e) => panic!("fulcrum-bench hung:\n{e}"),
    }
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_quick_report_has_every_section_and_names_the_kernel_set() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pack_synthetic(tmp.path(), "64");
    let data = data.to_str().unwrap();
    let quick = [
        "--quick",
        "--data",
        data,
        "--seconds",
        "0.1",
        "--batch",
        "4",
    ];
    // The larger model's records are packed under the cache: a throwaway one.
    let cache = tmp.path().join("cache");
    let cache_env = ("XDG_CACHE_HOME", cache.to_str().unwrap());
    let run = bench(
        tmp.path(),
        &[&quick[..], &["--cool-down", "0", "--json", "r.json"]].concat(),
        &[cache_env],
    );
    run.expect(0);
    for line in [
        "board", "cpu", "kernels", "io_uring", "io", "compute", "balance", "throttle",
    ] {
        assert!(
            run.stdout.lines().any(|l| l.trim_start().starts_with(line)),
            "no {line:?} line in:\n{}",
            run.stdout
        );
    }
    let r = json(&tmp.path().join("r.json"));
    assert_eq!(r["schema_version"], 2);
    assert_eq!(r["quick"], true);
    let set = r["board"]["cpu_kernels"].as_str().unwrap().to_owned();
    assert!(r["board"]["cpu_kernel_sets"]
        .as_array()
        .unwrap()
        .contains(&set.clone().into()));
    assert!(!r["board"]["clusters"].as_array().unwrap().is_empty());
    assert!(r["io"]["raw"]["mb_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["io"]["loader_cpu_us_per_record"].as_f64().unwrap() > 0.0);
    let compute = r["compute"].as_array().unwrap();
    let cpu = compute
        .iter()
        .find(|c| !c["threads"].is_null())
        .expect("a CPU row");
    assert_eq!(cpu["cpu_kernels"].as_str(), Some(set.as_str()));
    assert!(cpu["engine"]
        .as_str()
        .unwrap()
        .contains(&format!("{set} kernels")));
    assert!(cpu["train_step_ms"].as_f64().unwrap() > 0.0);
    if fulcrum::compute::vulkan::testing::required() {
        assert!(
            compute
                .iter()
                .any(|c| c["engine"].as_str().unwrap().starts_with("vulkan")),
            "no Vulkan row: {compute:?} {:?}",
            r["compute_errors"]
        );
    }
    // det-s at --batch from the given data, det-m at half of it from its own 256-px records.
    let balance = r["balance"].as_array().unwrap();
    assert_eq!(balance.len(), 2, "{balance:?} {:?}", r["balance_errors"]);
    for (b, (model, input, batch)) in balance.iter().zip([("det-s", 128, 4), ("det-m", 256, 2)]) {
        assert_eq!(b["model"], model);
        assert_eq!(b["input"], input);
        assert_eq!(b["batch"], batch);
        assert!(b["binding"].is_string());
        assert!(b["tg_ms"].as_f64().unwrap() > 0.0 && b["step_ms"].as_f64().unwrap() > 0.0);
    }
    assert!(
        balance[1]["step_ms"].as_f64() > balance[0]["step_ms"].as_f64(),
        "det-m's step must cost more than det-s's: {balance:?}"
    );
    assert!(cache
        .join("fulcrum/bench-synthetic-64-256px/manifest.json")
        .exists());
    assert!(r["throttle"]["samples"].as_u64().unwrap() >= 2);
    assert!(
        r["serve"]["forward_p50_ms"].as_f64().unwrap() > 0.0,
        "{}",
        r["serve_error"]
    );
    assert!(!r["serve"]["runs"].as_array().unwrap().is_empty());

    // A forced set is the one the CPU engine runs.
    let run = bench(
        tmp.path(),
        &[&quick[..], &["--cool-down", "0", "--json", "p.json"]].concat(),
        &[("FULCRUM_CPU_KERNELS", "portable"), cache_env],
    );
    run.expect(0);
    let p = json(&tmp.path().join("p.json"));
    assert_eq!(p["board"]["cpu_kernels"], "portable");
    let cpu = p["compute"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| !c["threads"].is_null())
        .cloned();
    assert_eq!(cpu.unwrap()["cpu_kernels"], "portable");
}

#[test]
fn a_kernel_set_this_cpu_cannot_run_is_refused_first() {
    let tmp = tempfile::tempdir().unwrap();
    let foreign = if cfg!(target_arch = "aarch64") {
        "avx2"
    } else {
        "neon"
    };
    let run = bench(
        tmp.path(),
        &["--quick"],
        &[("FULCRUM_CPU_KERNELS", foreign)],
    );
    run.expect(2);
    assert_mentions(
        &run.stderr,
        &[
            "FULCRUM_CPU_KERNELS",
            foreign,
            "cannot run on this CPU",
            "portable",
        ],
    );
    let run = bench(tmp.path(), &["--quick"], &[("FULCRUM_CPU_KERNELS", "sse9")]);
    run.expect(2);
    assert_mentions(&run.stderr, &["sse9", "names no kernel set"]);
    assert!(!tmp.path().join("r.json").exists());
}
