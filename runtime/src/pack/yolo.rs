//! YOLO txt datasets: one `<stem>.txt` per image, one `cls xc yc w h` line per box (normalised).
//!
//! Two layouts are understood:
//!
//! * **Split layout** (Ultralytics): `DIR/data.yaml` (or a `.yaml` file given directly) with
//!   `path` (the root; relative to the yaml's folder; missing or absent on this machine → the
//!   yaml's folder), `train` / `val` / `test` (a folder of images, a `.txt` list of image paths,
//!   or a list of those; relative to the root), `names` (a list, or a map id → name) and `nc`.
//!   A missing split folder written as `../x` is also looked for as `x` under the root, as
//!   Ultralytics does (Roboflow exports rely on it).
//! * **Flat layout**: `DIR/images/…` with `DIR/labels/…`, or images with their `.txt` files
//!   beside them. There are no splits: asking for one is an error ([`Error::NoSplits`]), so a
//!   typo never silently packs the wrong data. Class names come from `classes.txt` (in `DIR` or
//!   the labels folder), else from the first `DIR/*.yaml` (sorted by name) that has `names`,
//!   else `class0`…`classN` up to the largest class id seen.
//!
//! Either way an image's label file is its path with the last `images` folder replaced by
//! `labels` and the extension by `.txt` (the Ultralytics rule); image folders are searched
//! recursively, hidden files are ignored, and items are sorted by image path.
//!
//! Bad lines (wrong field count, non-numbers, negative, NaN or > 1 coordinates, class ≥ `nc`
//! when the names are known) are skipped and listed in `notes.rejected_labels` as
//! `file:line: reason`. A segmentation line (`cls x1 y1 x2 y2 …`, three or more points) becomes
//! its polygon's bounding box. (A pose line, `cls xc yc w h` + keypoints, cannot be told apart
//! from a polygon with an even count of keypoint values: pose datasets are not supported.)

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use super::source::{
    has_extension, is_any_image_path, is_image_path, list_files, BoxUnits, ImportNotes, SourceBox,
    SourceDataset, SourceItem,
};
use super::{Error, Result};
use crate::text::{debug_cut, quoted};

/// Largest class id accepted when a dataset names no classes (names are generated up to it).
const MAX_CLASS_ID: u32 = 65_535;
/// Slack for normalised coordinates written with float rounding (1.0000001).
const NORM_SLACK: f32 = 1e-3;

/// Imports a YOLO txt dataset at `dir` (a folder, or a data yaml file).
///
/// `split` picks the `data.yaml` entry (default `"train"`); it is an error for a flat dataset.
pub fn import(dir: &Path, split: Option<&str>) -> Result<SourceDataset> {
    let yaml = if dir.is_file() && has_extension(dir, &["yaml", "yml"]) {
        Some(dir.to_path_buf())
    } else {
        ["data.yaml", "data.yml"]
            .iter()
            .map(|n| dir.join(n))
            .find(|p| p.is_file())
    };
    let (sources, names) = match yaml {
        Some(path) => {
            let data = DataYaml::load(&path)?;
            let split = split.unwrap_or("train");
            (data.split_sources(split)?, data.names)
        }
        None => {
            if let Some(split) = split {
                return Err(Error::NoSplits {
                    dir: dir.to_owned(),
                    split: split.to_owned(),
                });
            }
            let root = flat_root(dir)?;
            let names = flat_names(dir, &label_dir_for(&root))?;
            (vec![ImageSource::Dir(root)], names)
        }
    };
    import_sources(dir, &sources, names)
}

/// Where the images of one split come from.
#[derive(Debug, Clone, PartialEq)]
enum ImageSource {
    /// A folder searched recursively.
    Dir(PathBuf),
    /// A text file listing one image path per line (relative to the list's folder).
    List(PathBuf),
}

/// The parts of an Ultralytics `data.yaml` that importing needs.
#[derive(Debug)]
struct DataYaml {
    path: PathBuf,
    root: PathBuf,
    doc: Yaml,
    /// From `names` (or generated from `nc` alone); `None` if the file has neither.
    names: Option<Vec<String>>,
}

impl DataYaml {
    fn load(path: &Path) -> Result<Self> {
        let bad = |what: String| Error::BadDataYaml {
            path: path.to_owned(),
            what,
        };
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let doc = parse_yaml(&text).map_err(bad)?;
        if doc.as_hash().is_none() {
            return Err(bad("the top level is not a map of keys".into()));
        }
        let yaml_dir = parent_dir(path);
        let root = match &doc["path"] {
            Yaml::Null | Yaml::BadValue => yaml_dir.clone(),
            v => {
                let p = scalar_string(v).ok_or_else(|| bad("`path` is not a string".into()))?;
                let root = join_clean(&yaml_dir, p.trim());
                if root.is_dir() {
                    root
                } else {
                    log::warn!(
                        "{}: `path` {} does not exist here; using the yaml's folder {} instead",
                        path.display(),
                        root.display(),
                        yaml_dir.display()
                    );
                    yaml_dir.clone()
                }
            }
        };
        let nc = match &doc["nc"] {
            Yaml::Null | Yaml::BadValue => None,
            Yaml::Integer(n) if (1..=MAX_CLASS_ID as i64 + 1).contains(n) => Some(*n as usize),
            v => {
                return Err(bad(format!(
                    "`nc` is {}, expected a positive integer",
                    debug_cut(v)
                )))
            }
        };
        let names = match &doc["names"] {
            Yaml::Null | Yaml::BadValue => None,
            v => Some(parse_names(v).map_err(bad)?),
        };
        let names = match (names, nc) {
            (Some(n), Some(nc)) if n.len() != nc => {
                return Err(bad(format!(
                    "`nc` is {nc} but `names` has {} entries",
                    n.len()
                )))
            }
            (Some(n), _) => Some(n),
            (None, Some(nc)) => Some((0..nc).map(|i| format!("class{i}")).collect()),
            (None, None) => None,
        };
        Ok(DataYaml {
            path: path.to_owned(),
            root,
            doc,
            names,
        })
    }

    /// The image folders / lists of `split`.
    fn split_sources(&self, split: &str) -> Result<Vec<ImageSource>> {
        let bad = |what: String| Error::BadDataYaml {
            path: self.path.clone(),
            what,
        };
        let entries: Vec<&Yaml> = match &self.doc[split] {
            Yaml::Null | Yaml::BadValue => {
                let have: Vec<&str> = ["train", "val", "test"]
                    .into_iter()
                    .filter(|k| !matches!(self.doc[*k], Yaml::Null | Yaml::BadValue))
                    .collect();
                return Err(bad(format!(
                    "no `{split}` split (it has: {}); pick one of those",
                    if have.is_empty() {
                        "none".to_owned()
                    } else {
                        have.join(", ")
                    }
                )));
            }
            Yaml::Array(a) => a.iter().collect(),
            v => vec![v],
        };
        let mut out = Vec::new();
        for e in entries {
            let rel = scalar_string(e)
                .ok_or_else(|| bad(format!("`{split}` entry {} is not a path", debug_cut(e))))?;
            let rel = rel.trim();
            let mut p = join_clean(&self.root, rel);
            if !p.exists() {
                let stripped = rel.trim_start_matches("../");
                if stripped != rel && join_clean(&self.root, stripped).exists() {
                    p = join_clean(&self.root, stripped);
                }
            }
            if p.is_dir() {
                out.push(ImageSource::Dir(p));
            } else if p.is_file() && has_extension(&p, &["txt"]) {
                out.push(ImageSource::List(p));
            } else {
                return Err(bad(format!(
                    "`{split}: {rel}` → {} is neither a folder of images nor a .txt list of them",
                    p.display()
                )));
            }
        }
        Ok(out)
    }
}

pub(crate) fn parse_yaml(text: &str) -> Result<Yaml, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| {
        let m = e.marker();
        format!("line {}, column {}: {}", m.line(), m.col() + 1, e.info())
    })?;
    Ok(docs.into_iter().next().unwrap_or(Yaml::Null))
}

/// A YAML scalar as text (class names like `1` or `true` are scalars of other types).
fn scalar_string(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `names` as a list, or as a map id → name (gaps are filled with `class<id>`).
pub(crate) fn parse_names(v: &Yaml) -> Result<Vec<String>, String> {
    match v {
        Yaml::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, n)| scalar_string(n).ok_or(format!("`names` entry {i} is not a name")))
            .collect(),
        Yaml::Hash(h) => {
            let mut by_id = std::collections::BTreeMap::new();
            for (k, n) in h {
                let id = match k {
                    Yaml::Integer(i) if (0..=MAX_CLASS_ID as i64).contains(i) => *i as usize,
                    _ => {
                        return Err(format!(
                            "`names` key {} is not a class id (0, 1, …)",
                            debug_cut(k)
                        ))
                    }
                };
                let name = scalar_string(n).ok_or(format!("`names` entry {id} is not a name"))?;
                by_id.insert(id, name);
            }
            let len = by_id.keys().next_back().map_or(0, |m| m + 1);
            if len != by_id.len() {
                log::warn!("`names` skips some class ids; they are named class<id>");
            }
            Ok((0..len)
                .map(|i| {
                    by_id
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| format!("class{i}"))
                })
                .collect())
        }
        _ => Err("`names` is neither a list nor a map id → name".into()),
    }
}

/// The image folder of a flat dataset: `DIR/images`, or `DIR` itself if it holds images.
fn flat_root(dir: &Path) -> Result<PathBuf> {
    let images = dir.join("images");
    if images.is_dir() {
        return Ok(images);
    }
    if !list_files(dir, false, &is_image_path)?.is_empty() {
        return Ok(dir.to_owned());
    }
    Err(Error::NotADataset {
        path: dir.to_owned(),
        what_we_looked_for: "a YOLO dataset: data.yaml, an images/ folder (with labels/), \
                             or images with .txt labels beside them"
            .into(),
    })
}

/// Class names of a flat dataset: `classes.txt`, else a yaml with `names`, else none.
fn flat_names(dir: &Path, label_dir: &Path) -> Result<Option<Vec<String>>> {
    for p in [dir.join("classes.txt"), label_dir.join("classes.txt")] {
        if p.is_file() {
            let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
            let names: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            if !names.is_empty() {
                return Ok(Some(names));
            }
        }
    }
    for p in list_files(dir, false, &|p| has_extension(p, &["yaml", "yml"]))? {
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        let Ok(doc) = parse_yaml(&text) else { continue };
        if let Ok(names) = parse_names(&doc["names"]) {
            if !names.is_empty() {
                log::info!("{}: class names taken from this file", p.display());
                return Ok(Some(names));
            }
        }
    }
    Ok(None)
}

/// The folder holding `file` (`.` for a bare file name).
fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// `base.join(rel)` without `.` components (`path: .` is common in data.yaml).
fn join_clean(base: &Path, rel: &str) -> PathBuf {
    let mut p = base.to_path_buf();
    for c in Path::new(rel).components() {
        if c != Component::CurDir {
            p.push(c);
        }
    }
    p
}

/// `p` with its last `images` component replaced by `labels`; `None` if it has none.
fn replace_images_component(p: &Path) -> Option<PathBuf> {
    let comps: Vec<Component> = p.components().collect();
    let i = comps.iter().rposition(|c| c.as_os_str() == "images")?;
    let mut out = PathBuf::new();
    for (j, c) in comps.iter().enumerate() {
        out.push(if j == i {
            "labels".as_ref()
        } else {
            c.as_os_str()
        });
    }
    Some(out)
}

/// The label folder matching an image folder (the folder itself when it has no `images`).
fn label_dir_for(image_dir: &Path) -> PathBuf {
    replace_images_component(image_dir).unwrap_or_else(|| image_dir.to_owned())
}

/// The label file of an image: the last `images` folder → `labels`, extension → `.txt`.
pub fn label_path_for(image: &Path) -> PathBuf {
    let dir = image.parent().unwrap_or(Path::new(""));
    label_dir_for(dir)
        .join(image.file_name().unwrap_or_default())
        .with_extension("txt")
}

fn import_sources(
    dir: &Path,
    sources: &[ImageSource],
    names: Option<Vec<String>>,
) -> Result<SourceDataset> {
    let mut notes = ImportNotes::default();
    let mut images = BTreeSet::new();
    for s in sources {
        match s {
            // GIFs and other unread formats too: packing names each one it leaves out.
            ImageSource::Dir(d) => images.extend(list_files(d, true, &is_any_image_path)?),
            ImageSource::List(f) => {
                let text = std::fs::read_to_string(f).map_err(|e| Error::io(f, e))?;
                let base = parent_dir(f);
                for (n, line) in text.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    let p = join_clean(&base, line);
                    if p.is_file() {
                        images.insert(p);
                    } else {
                        notes.rejected_labels.push(format!(
                            "{}:{}: image {} does not exist; skipped",
                            f.display(),
                            n + 1,
                            p.display()
                        ));
                    }
                }
            }
        }
    }
    if images.is_empty() {
        return Err(Error::NoImages {
            dir: dir.to_owned(),
        });
    }

    let nc = names.as_ref().map(Vec::len);
    let mut items = Vec::with_capacity(images.len());
    let mut label_files = BTreeSet::new();
    let mut max_class = None::<u32>;
    for image in images {
        let label = label_path_for(&image);
        let mut boxes = Vec::new();
        match std::fs::read(&label) {
            Ok(bytes) => {
                label_files.insert(label.clone());
                let Ok(text) = String::from_utf8(bytes) else {
                    notes.rejected_labels.push(format!(
                        "{}: not UTF-8 text; its image {} was skipped",
                        label.display(),
                        image.display()
                    ));
                    continue;
                };
                parse_labels(&text, &label, nc, &mut boxes, &mut notes.rejected_labels);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                notes.images_without_labels.push(image.clone());
            }
            Err(e) => {
                notes.rejected_labels.push(format!(
                    "{}: cannot read ({e}); its image {} was skipped",
                    label.display(),
                    image.display()
                ));
                continue;
            }
        }
        max_class = boxes.iter().map(|b| b.class).chain(max_class).max();
        items.push(SourceItem {
            image,
            units: BoxUnits::Normalized,
            boxes,
        });
    }

    // Label files that no image claimed, in the label folders of the image folders.
    for s in sources {
        if let ImageSource::Dir(d) = s {
            let ldir = label_dir_for(d);
            if !ldir.is_dir() {
                continue;
            }
            let is_label = |p: &Path| {
                has_extension(p, &["txt"])
                    && p.file_name().is_some_and(|n| n != "classes.txt")
                    && !label_files.contains(p)
            };
            notes
                .labels_without_image
                .extend(list_files(&ldir, true, &is_label)?);
        }
    }
    notes.labels_without_image.sort();
    notes.labels_without_image.dedup();

    let class_names = names.unwrap_or_else(|| {
        (0..max_class.map_or(0, |m| m + 1))
            .map(|i| format!("class{i}"))
            .collect()
    });
    Ok(SourceDataset {
        items,
        class_names,
        notes,
    })
}

/// Parses one label file's text into `boxes`; bad lines go to `rejected` as `file:line: why`.
/// `nc`, when known, bounds the class ids.
pub fn parse_labels(
    text: &str,
    file: &Path,
    nc: Option<usize>,
    boxes: &mut Vec<SourceBox>,
    rejected: &mut Vec<String>,
) {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        match parse_line(&fields, nc) {
            Ok(b) => boxes.push(b),
            Err(why) => rejected.push(format!("{}:{}: {why}", file.display(), n + 1)),
        }
    }
}

fn parse_line(fields: &[&str], nc: Option<usize>) -> Result<SourceBox, String> {
    let class = parse_class(fields[0])?;
    if let Some(nc) = nc {
        if class as usize >= nc {
            return Err(format!(
                "class {class} out of range: the dataset has {nc} classes"
            ));
        }
    }
    let values = fields[1..]
        .iter()
        .map(|f| match f.parse::<f32>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("{} is not a finite number", quoted(f))),
        })
        .collect::<Result<Vec<f32>, String>>()?;
    if let Some(v) = values
        .iter()
        .find(|&&v| !(0.0..=1.0 + NORM_SLACK).contains(&v))
    {
        return Err(format!(
            "coordinate {v} outside 0..1: YOLO labels are normalised by the image size"
        ));
    }
    let (x0, y0, x1, y1) = match values.len() {
        4 => {
            let [xc, yc, w, h] = [values[0], values[1], values[2], values[3]];
            if w <= 0.0 || h <= 0.0 {
                return Err(format!("empty box (width {w}, height {h})"));
            }
            (xc - w / 2.0, yc - h / 2.0, xc + w / 2.0, yc + h / 2.0)
        }
        n if n >= 6 && n % 2 == 0 => {
            let xs = values.iter().step_by(2);
            let ys = values.iter().skip(1).step_by(2);
            let (x0, x1) = xs.fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            let (y0, y1) = ys.fold((f32::MAX, f32::MIN), |(a, b), &y| (a.min(y), b.max(y)));
            if x1 <= x0 || y1 <= y0 {
                return Err("polygon with an empty bounding box".into());
            }
            (x0, y0, x1, y1)
        }
        n => {
            return Err(format!(
                "{} fields: expected `class xc yc w h` (5) or a polygon `class x1 y1 x2 y2 …` \
                 (an odd count, at least 7)",
                n + 1
            ))
        }
    };
    Ok(SourceBox {
        class,
        x0,
        y0,
        x1,
        y1,
    })
}

/// A class id: a non-negative integer (`3`, or `3.0` as some exporters write it).
fn parse_class(f: &str) -> Result<u32, String> {
    let bad = || format!("class {} is not a class id (0, 1, …)", quoted(f));
    let id = match f.parse::<u32>() {
        Ok(id) => id,
        Err(_) => {
            let v: f64 = f.parse().map_err(|_| bad())?;
            if !(v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64) {
                return Err(bad());
            }
            v as u32
        }
    };
    if id > MAX_CLASS_ID {
        return Err(format!(
            "class {id} is implausibly large (more than {MAX_CLASS_ID})"
        ));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const COCO128: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/coco128");

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A 1-byte "image": importers never decode, so content does not matter here.
    fn touch(path: &Path) {
        write(path, "x");
    }

    #[test]
    fn coco128_counts_match_the_data_readme() {
        let dir = Path::new(COCO128);
        if !dir.is_dir() {
            eprintln!("skipped: {COCO128} not found (shared test data is absent)");
            return;
        }
        let ds = import(dir, None).unwrap();
        assert_eq!(ds.items.len(), 128);
        let boxes: usize = ds.items.iter().map(|i| i.boxes.len()).sum();
        assert_eq!(boxes, 929);
        assert_eq!(ds.notes.images_without_labels.len(), 2);
        assert_eq!(ds.notes.labels_without_image.len(), 2);
        assert!(
            ds.notes.rejected_labels.is_empty(),
            "{:?}",
            ds.notes.rejected_labels
        );
        let bg = ds.items.iter().filter(|i| i.boxes.is_empty()).count();
        assert_eq!(bg, 2);
        assert_eq!(ds.class_names.len(), 80);
        assert_eq!(
            (ds.class_names[0].as_str(), ds.class_names[79].as_str()),
            ("person", "toothbrush")
        );
        assert!(
            ds.items.windows(2).all(|w| w[0].image < w[1].image),
            "sorted, unique"
        );
        for b in ds.items.iter().flat_map(|i| &i.boxes) {
            assert!(b.x0 < b.x1 && b.y0 < b.y1 && b.class < 80, "{b:?}");
            assert!(b.x0 >= -NORM_SLACK && b.x1 <= 1.0 + NORM_SLACK, "{b:?}");
        }
        // The val split of coco128's data.yaml is the same folder.
        assert_eq!(import(dir, Some("val")).unwrap().items.len(), 128);
        let err = import(dir, Some("test")).unwrap_err().to_string();
        assert!(
            err.contains("data.yaml") && err.contains("train, val"),
            "{err}"
        );
    }

    #[test]
    fn split_layout_from_data_yaml() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        write(
            &d.join("data.yaml"),
            "path: /nonexistent/elsewhere\ntrain: images/train\nval: [images/val]\nnc: 2\n\
             names:\n  0: cat\n  1: dog\n",
        );
        touch(&d.join("images/train/a.jpg"));
        touch(&d.join("images/train/b.PNG"));
        touch(&d.join("images/train/.hidden.jpg"));
        touch(&d.join("images/train/notes.md"));
        write(
            &d.join("labels/train/a.txt"),
            "0 0.5 0.5 0.2 0.4\n\n1 0.25 0.25 0.5 0.5\n",
        );
        write(&d.join("labels/train/zzz.txt"), "0 0.5 0.5 0.1 0.1\n");
        touch(&d.join("images/val/c.jpeg"));
        write(
            &d.join("labels/val/c.txt"),
            "2 0.5 0.5 0.1 0.1\n1 0.5 0.5 0.1 0.1\n",
        );

        let ds = import(d, None).unwrap();
        assert_eq!(ds.class_names, ["cat", "dog"]);
        let names: Vec<_> = ds
            .items
            .iter()
            .map(|i| i.image.file_name().unwrap())
            .collect();
        assert_eq!(names, ["a.jpg", "b.PNG"]);
        let a = &ds.items[0];
        assert_eq!(a.units, BoxUnits::Normalized);
        assert_eq!(
            a.boxes[0],
            SourceBox {
                class: 0,
                x0: 0.4,
                y0: 0.3,
                x1: 0.6,
                y1: 0.7
            }
        );
        assert_eq!(
            a.boxes[1],
            SourceBox {
                class: 1,
                x0: 0.0,
                y0: 0.0,
                x1: 0.5,
                y1: 0.5
            }
        );
        assert!(ds.items[1].boxes.is_empty());
        assert_eq!(
            ds.notes.images_without_labels,
            [d.join("images/train/b.PNG")]
        );
        assert_eq!(
            ds.notes.labels_without_image,
            [d.join("labels/train/zzz.txt")]
        );

        let val = import(d, Some("val")).unwrap();
        assert_eq!(val.items.len(), 1);
        assert_eq!(val.items[0].boxes.len(), 1, "class 2 ≥ nc is rejected");
        assert_eq!(val.notes.rejected_labels.len(), 1);
        let r = &val.notes.rejected_labels[0];
        assert!(r.contains("c.txt:1:") && r.contains("class 2"), "{r}");

        // The yaml file itself may be given; a missing split names what there is.
        let err = import(&d.join("data.yaml"), Some("test")).unwrap_err();
        assert!(matches!(err, Error::BadDataYaml { .. }), "{err}");

        write(
            &d.join("data.yaml"),
            "train: images/train\nnc: 3\nnames: [a, b]\n",
        );
        let err = import(d, None).unwrap_err().to_string();
        assert!(err.contains("`nc` is 3 but `names` has 2"), "{err}");
        write(&d.join("data.yaml"), "train: [images/train\n");
        let err = import(d, None).unwrap_err().to_string();
        assert!(err.contains("data.yaml") && err.contains("line"), "{err}");
        write(&d.join("data.yaml"), "train: images/nothere\nnames: [a]\n");
        let err = import(d, None).unwrap_err().to_string();
        assert!(err.contains("images/nothere"), "{err}");
    }

    #[test]
    fn roboflow_style_parent_paths_and_txt_lists() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        write(
            &d.join("data.yaml"),
            "train: ../train/images\nval: val.txt\nnames: [x]\n",
        );
        touch(&d.join("train/images/p.jpg"));
        write(&d.join("train/labels/p.txt"), "0 0.5 0.5 1 1\n");
        write(&d.join("val.txt"), "./train/images/p.jpg\nmissing.jpg\n");
        let ds = import(d, None).unwrap();
        assert_eq!(ds.items.len(), 1);
        assert_eq!(ds.items[0].boxes.len(), 1);
        let val = import(d, Some("val")).unwrap();
        assert_eq!(val.items.len(), 1);
        assert!(
            val.notes.rejected_labels[0].contains("val.txt:2:"),
            "{:?}",
            val.notes
        );
    }

    #[test]
    fn flat_layout_names_and_no_splits() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        touch(&d.join("images/a.jpg"));
        write(&d.join("labels/a.txt"), "4 0.5 0.5 0.2 0.2\n");
        write(&d.join("labels/classes.txt"), "");
        let ds = import(d, None).unwrap();
        assert_eq!(
            ds.class_names,
            ["class0", "class1", "class2", "class3", "class4"]
        );
        assert!(
            ds.notes.labels_without_image.is_empty(),
            "classes.txt is not a label file"
        );

        write(&d.join("other.yaml"), "names: [a, b, c, d, e, f]\n");
        assert_eq!(import(d, None).unwrap().class_names.len(), 6);
        write(&d.join("classes.txt"), "zero\none\n");
        let ds = import(d, None).unwrap();
        assert_eq!(ds.class_names, ["zero", "one"]);
        assert!(ds.items[0].boxes.is_empty(), "class 4 ≥ 2 classes");
        assert_eq!(ds.notes.rejected_labels.len(), 1);

        let err = import(d, Some("train")).unwrap_err();
        assert!(matches!(err, Error::NoSplits { .. }), "{err}");
        assert!(err.to_string().contains("no data.yaml"), "{err}");
    }

    #[test]
    fn labels_beside_images_and_not_a_dataset() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        touch(&d.join("a.jpg"));
        write(&d.join("a.txt"), "0 0.5 0.5 0.5 0.5");
        let ds = import(d, None).unwrap();
        assert_eq!(ds.items[0].boxes.len(), 1, "last line without newline");
        assert_eq!(ds.class_names, ["class0"]);

        let empty = tempfile::tempdir().unwrap();
        let err = import(empty.path(), None).unwrap_err();
        assert!(matches!(err, Error::NotADataset { .. }), "{err}");
        std::fs::create_dir(empty.path().join("images")).unwrap();
        assert!(matches!(
            import(empty.path(), None),
            Err(Error::NoImages { .. })
        ));
        let err = import(&empty.path().join("nope"), None).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn malformed_lines_are_rejected_with_file_and_line() {
        let text = "\u{feff}0 0.5 0.5 0.2 0.2\r\n\
                    \n\
                    0 0.5 0.5 0.2\n\
                    x 0.5 0.5 0.2 0.2\n\
                    -1 0.5 0.5 0.2 0.2\n\
                    0 nan 0.5 0.2 0.2\n\
                    0 -0.1 0.5 0.2 0.2\n\
                    0 320 240 50 50\n\
                    0 0.5 0.5 0 0.2\n\
                    1.0 0.1 0.1 0.3 0.1 0.2 0.4\n\
                    0 0.1 0.1 0.3 0.1 0.2\n\
                    0 0.5 0.5 0.2 0.2 0.9\n\
                    7 0.5 0.5 0.2 0.2\n   \n";
        let (mut boxes, mut rejected) = (Vec::new(), Vec::new());
        parse_labels(
            text,
            Path::new("l/a.txt"),
            Some(3),
            &mut boxes,
            &mut rejected,
        );
        assert_eq!(boxes.len(), 2, "{boxes:?}");
        assert_eq!(boxes[0].class, 0);
        let p = boxes[1];
        assert_eq!(p.class, 1);
        assert!((p.x0 - 0.1).abs() < 1e-6 && (p.x1 - 0.3).abs() < 1e-6);
        assert!((p.y0 - 0.1).abs() < 1e-6 && (p.y1 - 0.4).abs() < 1e-6);
        let lines: Vec<&str> = rejected
            .iter()
            .map(|r| r.split(": ").next().unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                "l/a.txt:3",
                "l/a.txt:4",
                "l/a.txt:5",
                "l/a.txt:6",
                "l/a.txt:7",
                "l/a.txt:8",
                "l/a.txt:9",
                "l/a.txt:11",
                "l/a.txt:12",
                "l/a.txt:13"
            ]
        );
        assert!(rejected[5].contains("normalised"), "{}", rejected[5]);
        assert!(rejected[9].contains("3 classes"), "{}", rejected[9]);
    }

    #[test]
    fn label_paths_follow_the_ultralytics_rule() {
        assert_eq!(
            label_path_for(Path::new("/d/images/train/x.jpg")),
            Path::new("/d/labels/train/x.txt")
        );
        assert_eq!(
            label_path_for(Path::new("/images/d/images/x.y.png")),
            Path::new("/images/d/labels/x.y.txt")
        );
        assert_eq!(label_path_for(Path::new("d/x.jpg")), Path::new("d/x.txt"));
        assert_eq!(
            label_path_for(Path::new("/d/images.jpg")),
            Path::new("/d/images.txt")
        );
    }
}
