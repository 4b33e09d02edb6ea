//! The documentation stays a guide and stays true: the README short, its test command where CI
//! looks for it, every link between the pages resolving, no reference to the founding design
//! document outside the repository, and every environment variable the code reads listed.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// Files under `dir` (recursively) whose names end in one of `exts`, skipping build output
/// and hidden folders.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            files(&path, exts, out);
        } else if exts.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    files(&root().join("docs"), &[".md"], &mut pages);
    pages
}

#[test]
fn the_readme_is_a_guide_with_its_test_command() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines: keep it a guide (at most 400) and put the rest in docs/"
    );
    let marker = readme
        .lines()
        .position(|l| l.trim() == "<!-- ci: test-command -->")
        .expect("the CI marker before the test command");
    let fence: Vec<&str> = readme.lines().skip(marker + 1).take(2).collect();
    assert!(
        fence[0].starts_with("```") && fence[1].starts_with("cargo test"),
        "{fence:?}"
    );
    for page in ["architecture.md", "cli.md", "daemon.md"] {
        assert!(
            readme.contains(&format!("(docs/{page}")),
            "the README links docs/{page}"
        );
    }
}

#[test]
fn every_link_between_the_pages_resolves() {
    let (mut broken, mut checked) = (Vec::new(), 0);
    let pages = pages();
    assert!(pages.len() > 5, "{pages:?}");
    for page in &pages {
        let text = read(page);
        let dir = page.parent().unwrap();
        // Markdown links `](target)`, outside code spans' backticks as the pages write them.
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with('#') || target.contains(' ') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            checked += 1;
            if !dir.join(file).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the link syntax still `](…)`?"
    );
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

#[test]
fn nothing_points_at_the_design_document_outside_the_repository() {
    let mut all = Vec::new();
    for dir in [
        "runtime", "tools", "tests", "board", "docs", "shaders", ".ci",
    ] {
        files(
            &root().join(dir),
            &[".rs", ".md", ".sh", ".toml", ".comp", ".glsl", ".py", ".c"],
            &mut all,
        );
    }
    all.push(root().join("README.md"));
    all.push(root().join(".ci/run"));
    let design = ["DESIGN", ".md"].concat();
    let pointing: Vec<String> = all
        .iter()
        .filter(|p| read(p).contains(&design))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        pointing.is_empty(),
        "{design} is outside the repository and the code has moved past it; \
         docs/architecture.md is the picture: {pointing:?}"
    );
}

#[test]
fn every_environment_variable_the_code_reads_is_documented() {
    let mut sources = Vec::new();
    for dir in ["runtime/src", "tools/src", "tests/src", "board/src"] {
        files(&root().join(dir), &[".rs"], &mut sources);
    }
    let mut names = std::collections::BTreeSet::new();
    for path in &sources {
        let text = read(path);
        for (i, _) in text.match_indices("\"FULCRUM_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            names.insert(name);
        }
    }
    assert!(names.len() >= 10, "{names:?}");
    let cli = read(&root().join("docs/cli.md"));
    let table = cli
        .split("## Environment")
        .nth(1)
        .expect("docs/cli.md has an Environment section");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !table.contains(&format!("`{n}")))
        .collect();
    assert!(
        missing.is_empty(),
        "read by the code but not in docs/cli.md's Environment table: {missing:?}"
    );
}
