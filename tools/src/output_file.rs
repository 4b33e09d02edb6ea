//! Files a command writes its results to (`--json`, `--svg`, `--html`): checked before the
//! work starts, so a benchmark does not run for minutes and then fail on a typo, and written
//! atomically after, naming the file when that fails.

use std::path::Path;

use anyhow::{bail, Context};

/// Refuses `path` for `option` when it is a folder or its folder does not exist.
pub fn check(option: &str, path: &Path) -> anyhow::Result<()> {
    let shown = fulcrum::text::quoted(&path.to_string_lossy());
    if path.is_dir() {
        bail!("{option} {shown} is a folder; give a file name (e.g. {shown}/report.json)");
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent.filter(|p| !p.is_dir()) {
        let folder = fulcrum::text::quoted(&parent.to_string_lossy());
        bail!("{option} {shown}: the folder {folder} does not exist (or is not a folder); create it or write elsewhere");
    }
    Ok(())
}

/// [`check`] for an optional path.
pub fn check_some(option: &str, path: Option<&Path>) -> anyhow::Result<()> {
    path.map_or(Ok(()), |p| check(option, p))
}

/// `value` as pretty JSON into `path`, atomically; says so on stderr.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    write(
        path,
        (serde_json::to_string_pretty(value)? + "\n").as_bytes(),
    )
}

/// `bytes` into `path`, atomically; says so on stderr.
pub fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    fulcrum::durable::write_atomic(path, bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_and_missing_parents_are_refused_before_the_work() {
        let t = tempfile::tempdir().unwrap();
        let err = check("--json", t.path()).unwrap_err().to_string();
        assert!(err.contains("is a folder"), "{err}");
        let err = check("--json", &t.path().join("no/such/r.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
        check("--json", &t.path().join("r.json")).unwrap();
        check("--json", Path::new("r.json")).unwrap();

        let file = t.path().join("r.json");
        write_json(&file, &serde_json::json!({"a": 1})).unwrap();
        assert!(std::fs::read_to_string(&file).unwrap().contains("\"a\": 1"));
    }
}
