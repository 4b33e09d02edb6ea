//! COCO JSON datasets: one file with `images`, `annotations` and `categories`.
//!
//! * `categories`: COCO ids are sparse (1…90 for 80 classes), so they are mapped to dense class
//!   ids `0..K` in increasing id order; names are kept as given.
//! * `images`: `file_name` is resolved against the image folder: the one given, else the JSON's
//!   own folder, then `images/` beside the JSON (first hit per image). `width`/`height` are not
//!   trusted: the decoded image gives the real size. An entry whose file is missing is listed
//!   in `notes.labels_without_image` and skipped with its annotations.
//! * `annotations`: `bbox` is `[x, y, w, h]` in 0-based continuous pixels → corners
//!   `(x, y)`–`(x + w, y + h)`. Crowd regions (`iscrowd: 1`) are not objects a detector should
//!   learn to box, so they are skipped and counted in `notes.rejected_labels` with that reason,
//!   as are annotations with an unknown image or category or a bad box.
//!
//! An image with no annotation at all is packed as background and listed in
//! `notes.images_without_labels`. Items are sorted by image path.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::source::{has_extension, BoxUnits, ImportNotes, SourceBox, SourceDataset, SourceItem};
use super::{Error, Result};

/// An image or category id: COCO uses integers, some exporters strings.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(untagged)]
enum Id {
    Int(i64),
    Str(String),
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Int(i) => write!(f, "{i}"),
            Id::Str(s) => f.write_str(&crate::text::quoted(s)),
        }
    }
}

#[derive(Deserialize)]
struct CocoFile {
    #[serde(default)]
    images: Vec<CocoImage>,
    #[serde(default)]
    annotations: Vec<CocoAnnotation>,
    #[serde(default)]
    categories: Vec<CocoCategory>,
}

#[derive(Deserialize)]
struct CocoImage {
    id: Id,
    file_name: String,
}

/// Fields are loose (`Value`, `Option`) so that one odd annotation is rejected on its own
/// instead of failing the whole file; unknown fields (`segmentation`…) are skipped unparsed.
#[derive(Deserialize)]
struct CocoAnnotation {
    id: Option<Id>,
    image_id: Option<Id>,
    category_id: Option<Id>,
    bbox: Option<serde_json::Value>,
    iscrowd: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct CocoCategory {
    id: Id,
    name: String,
}

/// Imports the COCO JSON file `json`, with images under `image_dir` (default: see module docs).
pub fn import(json: &Path, image_dir: Option<&Path>) -> Result<SourceDataset> {
    let bytes = std::fs::read(json).map_err(|e| Error::io(json, e))?;
    import_bytes(&bytes, json, image_dir)
}

/// [`import`] of the JSON's bytes already read (`json` names the file in errors and locates
/// the images when `image_dir` is not given).
pub fn import_bytes(bytes: &[u8], json: &Path, image_dir: Option<&Path>) -> Result<SourceDataset> {
    let bad = |what: String| Error::BadCoco {
        path: json.to_owned(),
        what,
    };
    let file: CocoFile = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;

    let mut cats: Vec<&CocoCategory> = file.categories.iter().collect();
    cats.sort_by(|a, b| a.id.cmp(&b.id));
    if let Some(w) = cats.windows(2).find(|w| w[0].id == w[1].id) {
        return Err(bad(format!("category id {} appears twice", w[0].id)));
    }
    if cats.is_empty() && !file.annotations.is_empty() {
        return Err(bad("`categories` is empty but there are annotations".into()));
    }
    let class_of: BTreeMap<&Id, u32> = cats
        .iter()
        .enumerate()
        .map(|(i, c)| (&c.id, i as u32))
        .collect();
    let class_names = cats.iter().map(|c| c.name.clone()).collect();

    let json_dir = match json.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let dirs = match image_dir {
        Some(d) => vec![d.to_owned()],
        None => vec![json_dir.clone(), json_dir.join("images")],
    };

    let mut notes = ImportNotes::default();
    let at = |a: &CocoAnnotation, i: usize| match &a.id {
        Some(id) => format!("{}: annotation id {id}", json.display()),
        None => format!("{}: annotations[{i}]", json.display()),
    };
    // Image id → path (None: its file is missing); path → boxes.
    let mut image_path: BTreeMap<&Id, Option<PathBuf>> = BTreeMap::new();
    let mut by_path: BTreeMap<PathBuf, (Vec<SourceBox>, bool)> = BTreeMap::new();
    for (i, img) in file.images.iter().enumerate() {
        if image_path.contains_key(&img.id) {
            notes.rejected_labels.push(format!(
                "{}: images[{i}]: image id {} appears twice; skipped",
                json.display(),
                img.id
            ));
            continue;
        }
        let found = dirs
            .iter()
            .map(|d| d.join(&img.file_name))
            .find(|p| p.is_file());
        match found {
            Some(p) if by_path.contains_key(&p) => {
                notes.rejected_labels.push(format!(
                    "{}: images[{i}]: {} is listed twice; the second entry (id {}) is skipped",
                    json.display(),
                    p.display(),
                    img.id
                ));
                image_path.insert(&img.id, None);
            }
            Some(p) => {
                by_path.insert(p.clone(), (Vec::new(), false));
                image_path.insert(&img.id, Some(p));
            }
            None => {
                notes
                    .labels_without_image
                    .push(dirs[0].join(&img.file_name));
                image_path.insert(&img.id, None);
            }
        }
    }

    for (i, a) in file.annotations.iter().enumerate() {
        let Some(image_id) = &a.image_id else {
            notes
                .rejected_labels
                .push(format!("{}: no image_id; skipped", at(a, i)));
            continue;
        };
        let path = match image_path.get(image_id) {
            Some(Some(p)) => p,
            Some(None) => continue, // the image is missing or skipped: already noted
            None => {
                notes.rejected_labels.push(format!(
                    "{}: image_id {image_id} is not in `images`; skipped",
                    at(a, i)
                ));
                continue;
            }
        };
        let entry = by_path
            .get_mut(path)
            .expect("every found image has an entry");
        entry.1 = true;
        match annotation_box(a, &class_of) {
            Ok(b) => entry.0.push(b),
            Err(why) => notes
                .rejected_labels
                .push(format!("{}: {why}; skipped", at(a, i))),
        }
    }

    let mut items = Vec::with_capacity(by_path.len());
    for (image, (boxes, annotated)) in by_path {
        if !annotated {
            notes.images_without_labels.push(image.clone());
        }
        items.push(SourceItem {
            image,
            units: BoxUnits::Pixels,
            boxes,
        });
    }
    if items.is_empty() {
        return Err(Error::NoImages {
            dir: dirs[0].clone(),
        });
    }
    Ok(SourceDataset {
        items,
        class_names,
        notes,
    })
}

fn annotation_box(a: &CocoAnnotation, class_of: &BTreeMap<&Id, u32>) -> Result<SourceBox, String> {
    let crowd = match &a.iscrowd {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(v) => v.as_f64().is_some_and(|x| x != 0.0),
    };
    if crowd {
        return Err("crowd region (iscrowd) is not an object box".into());
    }
    let cat = a.category_id.as_ref().ok_or("no category_id")?;
    let class = *class_of
        .get(cat)
        .ok_or(format!("category_id {cat} is not in `categories`"))?;
    let nums: Option<Vec<f64>> = match &a.bbox {
        Some(serde_json::Value::Array(v)) if v.len() == 4 => v.iter().map(|x| x.as_f64()).collect(),
        _ => None,
    };
    let [x, y, w, h] = match nums.as_deref() {
        Some(&[x, y, w, h]) if [x, y, w, h].iter().all(|v| v.is_finite()) => [x, y, w, h],
        _ => {
            return Err(format!(
                "bbox {} is not [x, y, width, height]",
                crate::text::debug_cut(&a.bbox)
            ))
        }
    };
    if w <= 0.0 || h <= 0.0 {
        return Err(format!("empty bbox (width {w}, height {h})"));
    }
    Ok(SourceBox {
        class,
        x0: x as f32,
        y0: y as f32,
        x1: (x + w) as f32,
        y1: (y + h) as f32,
    })
}

/// The ids of a COCO annotations file, for detections written in COCO's results format that
/// refer to it: image ids by file name (its last path component) and category ids by name.
#[derive(Debug, Clone, Default)]
pub struct CocoIds {
    pub images: BTreeMap<String, serde_json::Value>,
    pub categories: BTreeMap<String, serde_json::Value>,
}

/// Reads the image and category ids of the COCO JSON file `json`.
pub fn read_ids(json: &Path) -> Result<CocoIds> {
    let bytes = std::fs::read(json).map_err(|e| Error::io(json, e))?;
    let bad = |what: String| Error::BadCoco {
        path: json.to_owned(),
        what,
    };
    let file: CocoFile = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    let id = |id: &Id| match id {
        Id::Int(i) => serde_json::Value::from(*i),
        Id::Str(s) => serde_json::Value::from(s.as_str()),
    };
    let mut ids = CocoIds::default();
    for image in &file.images {
        let name = Path::new(&image.file_name)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if ids.images.insert(name.clone(), id(&image.id)).is_some() {
            return Err(bad(format!(
                "two images are named {}: detections could not say which one they are of",
                crate::text::quoted(&name)
            )));
        }
    }
    for category in &file.categories {
        if ids
            .categories
            .insert(category.name.clone(), id(&category.id))
            .is_some()
        {
            return Err(bad(format!(
                "two categories are named {}",
                crate::text::quoted(&category.name)
            )));
        }
    }
    Ok(ids)
}

/// Whether `path` looks like a COCO JSON file: a `.json` file whose first MiB is an object with
/// `"images"` and `"file_name"`. A cheap sniff for choosing an importer, not a validation.
pub fn looks_like_coco(path: &Path) -> bool {
    if !has_extension(path, &["json"]) {
        return false;
    }
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = Vec::new();
    if f.take(1 << 20).read_to_end(&mut head).is_err() {
        return false;
    }
    let head = String::from_utf8_lossy(&head);
    head.trim_start_matches('\u{feff}')
        .trim_start()
        .starts_with('{')
        && head.contains("\"images\"")
        && head.contains("\"file_name\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::RgbImage::from_pixel(4, 3, image::Rgb([9, 8, 7]))
            .save(path)
            .unwrap();
    }

    const FIXTURE: &str = r#"{
      "info": {"description": "tiny"},
      "images": [
        {"id": 1, "file_name": "a.png", "width": 4, "height": 3},
        {"id": 2, "file_name": "b.png", "width": 4, "height": 3},
        {"id": 3, "file_name": "missing.png", "width": 4, "height": 3},
        {"id": 1, "file_name": "dup.png", "width": 4, "height": 3},
        {"id": "s", "file_name": "c.png"}
      ],
      "annotations": [
        {"id": 10, "image_id": 1, "category_id": 18, "bbox": [0.5, 1, 2, 1.5], "iscrowd": 0,
         "segmentation": [[0, 0, 1, 1, 2, 0]], "area": 3},
        {"id": 11, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 3]},
        {"id": 12, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 3], "iscrowd": 1},
        {"id": 13, "image_id": 1, "category_id": 5, "bbox": [0, 0, 1, 1]},
        {"id": 14, "image_id": 9, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"id": 15, "image_id": 1, "category_id": 1, "bbox": [0, 0, 0, 1]},
        {"id": 16, "image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"image_id": "s", "category_id": 1, "bbox": [0, 0, null, 1]}
      ],
      "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}]
    }"#;

    #[test]
    fn tiny_fixture() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let json = d.join("ann.json");
        std::fs::write(&json, FIXTURE).unwrap();
        png(&d.join("images/a.png"));
        png(&d.join("images/b.png"));
        png(&d.join("c.png"));
        assert!(looks_like_coco(&json));

        let ds = import(&json, None).unwrap();
        assert_eq!(
            ds.class_names,
            ["person", "dog"],
            "dense ids in COCO id order"
        );
        let names: Vec<_> = ds.items.iter().map(|i| i.image.clone()).collect();
        assert_eq!(
            names,
            [
                d.join("c.png"),
                d.join("images/a.png"),
                d.join("images/b.png")
            ]
        );
        let a = &ds.items[1];
        assert_eq!(a.units, BoxUnits::Pixels);
        assert_eq!(
            a.boxes,
            [
                SourceBox {
                    class: 1,
                    x0: 0.5,
                    y0: 1.0,
                    x1: 2.5,
                    y1: 2.5
                },
                SourceBox {
                    class: 0,
                    x0: 0.0,
                    y0: 0.0,
                    x1: 4.0,
                    y1: 3.0
                }
            ]
        );
        assert!(ds.items[0].boxes.is_empty() && ds.items[2].boxes.is_empty());
        assert_eq!(ds.notes.images_without_labels, [d.join("images/b.png")]);
        assert_eq!(ds.notes.labels_without_image, [d.join("missing.png")]);
        let r = ds.notes.rejected_labels.join("\n");
        assert_eq!(ds.notes.rejected_labels.len(), 6, "{r}");
        for want in [
            "images[3]: image id 1 appears twice",
            "annotation id 12: crowd region",
            "annotation id 13: category_id 5 is not in `categories`",
            "annotation id 14: image_id 9 is not in `images`",
            "annotation id 15: empty bbox",
            "annotations[7]: bbox",
        ] {
            assert!(r.contains(want), "{want:?} not in\n{r}");
        }

        // An explicit image folder is the only place looked in.
        let ds = import(&json, Some(&d.join("images"))).unwrap();
        assert_eq!(ds.items.len(), 2);
        assert_eq!(ds.notes.labels_without_image.len(), 2);
    }

    #[test]
    fn bad_files_name_the_file_and_the_place() {
        let t = tempfile::tempdir().unwrap();
        let json = t.path().join("x.json");
        std::fs::write(&json, "{\"images\": [\n{\"id\": 1, \"file_name\": 5}]}").unwrap();
        let err = import(&json, None).unwrap_err();
        assert!(matches!(err, Error::BadCoco { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("x.json") && msg.contains("line 2"), "{msg}");

        let cats =
            r#"{"images": [], "categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}"#;
        std::fs::write(&json, cats).unwrap();
        assert!(import(&json, None)
            .unwrap_err()
            .to_string()
            .contains("category id 1 appears twice"));
        std::fs::write(&json, r#"{"images": [], "categories": []}"#).unwrap();
        assert!(matches!(import(&json, None), Err(Error::NoImages { .. })));
        assert!(matches!(
            import(&t.path().join("nope.json"), None),
            Err(Error::Io { .. })
        ));

        std::fs::write(&json, "[1, 2]").unwrap();
        assert!(!looks_like_coco(&json));
        assert!(!looks_like_coco(&t.path().join("nope.json")));
        let yaml = t.path().join("x.yaml");
        std::fs::write(&yaml, r#"{"images": [{"file_name": "a"}]}"#).unwrap();
        assert!(!looks_like_coco(&yaml));
    }
}
