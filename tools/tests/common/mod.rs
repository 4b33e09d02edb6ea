//! Helpers the integration tests of the binaries share.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

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
