//! The library's layers hold: every top-level module of `runtime/src` imports only the modules
//! that docs/architecture.md lists below it, and exactly those its "may import" names, so
//! the page stays the picture of the code. Test code (`#[cfg(test)]` items and the files only
//! test modules declare) may reach up and is not counted.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// One line of the architecture page's list: `N. module — … — may import: a, b` (or `none`).
#[derive(Debug)]
struct Layer {
    module: String,
    may_import: BTreeSet<String>,
}

fn layers_on_the_page() -> Vec<Layer> {
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = page
        .split("## 2. The library's layers")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/architecture.md has its section 2, the layers");
    let mut layers: Vec<Layer> = Vec::new();
    for line in section.lines() {
        let Some((number, rest)) = line.split_once(". ") else {
            continue;
        };
        if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        assert_eq!(
            number.parse::<usize>().unwrap(),
            layers.len() + 1,
            "the list is numbered in order: {line}"
        );
        let module = rest.split(" — ").next().unwrap().trim().to_owned();
        let may = line
            .rsplit_once("may import: ")
            .unwrap_or_else(|| panic!("no \"may import:\" in {line}"))
            .1
            .trim();
        let may_import = match may {
            "none" => BTreeSet::new(),
            list => list.split(',').map(|m| m.trim().to_owned()).collect(),
        };
        layers.push(Layer { module, may_import });
    }
    layers
}

/// `text` without `//` comments (doc comments name modules freely).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` without its `#[cfg(test)]` items; the files of `#[cfg(test)] mod name;` lines
/// (relative to `dir`, the folder such a file's modules live in) go into `test_files`.
fn without_test_items(text: &str, dir: &Path, test_files: &mut HashSet<PathBuf>) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < lines.len() && lines[j].trim().starts_with("#[") {
            j += 1;
        }
        let item = lines.get(j).map_or("", |l| l.trim());
        let declared = item
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = declared {
            test_files.insert(dir.join(format!("{name}.rs")));
            test_files.insert(dir.join(name));
            i = j + 1;
            continue;
        }
        // Skip the item: to its closing brace, or its semicolon when it has no body.
        let (mut depth, mut opened, mut k) = (0i32, false, j);
        while k < lines.len() {
            for c in lines[k].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth == 0) || (!opened && lines[k].trim_end().ends_with(';')) {
                break;
            }
            k += 1;
        }
        i = k + 1;
    }
    out.join("\n")
}

/// The top-level modules each `crate::NAME` path in `code` names.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `fulcrum_crate::…` and the like
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for part in inner.split(',') {
                let name = part.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    found.insert(name.to_owned());
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each top-level module's imports of other top-level modules, outside test code.
fn imports_in_the_code() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("runtime/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut test_files = HashSet::new();
    let mut code = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        // A `mod x;` in `a/b.rs` or `a/b/mod.rs` lives in `a/b/`; in `lib.rs`, in `src/`.
        let dir = if name == "mod.rs" || name == "lib.rs" {
            path.parent().unwrap().to_path_buf()
        } else {
            path.with_extension("")
        };
        code.push((
            path.clone(),
            without_test_items(&without_comments(&text), &dir, &mut test_files),
        ));
    }
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, code) in code {
        if test_files.iter().any(|t| path.starts_with(t)) {
            continue;
        }
        let relative = path.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
        if module == "lib" {
            continue;
        }
        let entry = imports.entry(module.clone()).or_default();
        entry.extend(crate_paths(&code).into_iter().filter(|m| *m != module));
    }
    imports
}

#[test]
fn every_module_imports_only_what_the_architecture_page_says_from_below() {
    let layers = layers_on_the_page();
    assert!(layers.len() >= 15, "{layers:?}");
    let rank: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| (l.module.as_str(), i))
        .collect();
    let imports = imports_in_the_code();
    let mut problems = Vec::new();
    for module in imports.keys() {
        if !rank.contains_key(module.as_str()) {
            problems.push(format!("module {module} is not in the page's list"));
        }
    }
    for layer in &layers {
        let Some(actual) = imports.get(&layer.module) else {
            problems.push(format!(
                "the page lists {}, which runtime/src does not have",
                layer.module
            ));
            continue;
        };
        let here = rank[layer.module.as_str()];
        for imported in actual {
            match rank.get(imported.as_str()) {
                Some(&there) if there > here => problems.push(format!(
                    "{} (layer {}) imports {imported} (layer {}), above it",
                    layer.module,
                    here + 1,
                    there + 1
                )),
                None => problems.push(format!(
                    "{} imports crate::{imported}, which the page does not list",
                    layer.module
                )),
                _ => {}
            }
        }
        if *actual != layer.may_import {
            problems.push(format!(
                "{}: the page says it may import {:?}, the code imports {:?}",
                layer.module, layer.may_import, actual
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/architecture.md section 2 and the code disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_import_scanner_sees_paths_groups_and_skips_tests_and_comments() {
    let code = "use crate::a::X;\nuse crate::{b, c::Y};\nfn f() { crate::d::g() }\n\
                // crate::e\n#[cfg(test)]\nmod tests {\n    use crate::f;\n}\n\
                #[cfg(test)]\nmod more;\nuse fulcrum_crate::h;\n";
    let mut test_files = HashSet::new();
    let stripped = without_test_items(&without_comments(code), Path::new("x"), &mut test_files);
    let found: Vec<String> = crate_paths(&stripped).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "d"]);
    assert!(test_files.contains(Path::new("x/more.rs")));
}
