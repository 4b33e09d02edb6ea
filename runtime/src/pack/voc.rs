//! Pascal VOC XML datasets: one `<annotation>` file per image.
//!
//! Layout: annotations in `DIR/annotations/` or `DIR/Annotations/` (or `*.xml` in `DIR` itself,
//! as labelImg saves them), images in `DIR/images/` or `DIR/JPEGImages/` (else `DIR`). Neither
//! folder is searched recursively; `ImageSets/` split lists are not read (all files are imported).
//!
//! Per file: `<filename>` names the image (relative to the images folder; if absent or wrong,
//! the XML's own stem with a common image extension is tried), and each `<object>` gives `<name>`
//! and `<bndbox>` `xmin ymin xmax ymax` (floats accepted). `<size>` is ignored: the real size
//! comes from the decoded image. Objects marked `<difficult>1</difficult>` are kept, as the VOC
//! devkit keeps them in the ground truth.
//!
//! VOC pixel coordinates are 1-based and inclusive (`xmin = 1` is the first column, `xmax = W`
//! the last), so a box becomes the continuous 0-based corners
//! `(xmin − 1, ymin − 1)`–`(xmax, ymax)`.
//!
//! Class ids are the sorted unique `<name>`s of all imported objects (deterministic whatever the
//! file order). Bad objects and malformed files are skipped and listed in `notes.rejected_labels`
//! (`file:line: reason`); the image of a malformed file is skipped too, not packed as background.
//! Images without an annotation are background; annotations naming no image are listed in
//! `notes.labels_without_image`. Importing fails only when nothing at all could be read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::source::{
    has_extension, is_image_path, list_files, BoxUnits, ImportNotes, SourceBox, SourceDataset,
    SourceItem,
};
use super::{Error, Result};
use crate::text::quoted;

/// Extensions tried when `<filename>` does not name an existing file.
const FALLBACK_EXTENSIONS: [&str; 6] = ["jpg", "jpeg", "png", "JPG", "JPEG", "PNG"];

/// Imports the Pascal VOC dataset at `dir`.
pub fn import(dir: &Path) -> Result<SourceDataset> {
    let is_xml = |p: &Path| has_extension(p, &["xml"]);
    let ann_dir = ["annotations", "Annotations"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| dir.to_owned());
    let xml_files = list_files(&ann_dir, false, &is_xml)?;
    if xml_files.is_empty() {
        return Err(Error::NotADataset {
            path: dir.to_owned(),
            what_we_looked_for: "Pascal VOC: *.xml files in annotations/, Annotations/ or the \
                                 folder itself"
                .into(),
        });
    }
    let image_dir = ["images", "JPEGImages"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| dir.to_owned());
    let on_disk = list_files(&image_dir, false, &is_image_path)?;

    let mut notes = ImportNotes::default();
    // Image → (annotation file, objects as (name, corners)); `None` for a skipped image.
    let mut claimed: BTreeMap<PathBuf, Option<(PathBuf, Vec<Object>)>> = BTreeMap::new();
    let mut first_failure = None;
    let mut parsed = 0usize;
    for xml in &xml_files {
        let stem = xml
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let file = match read_annotation(xml, &mut notes.rejected_labels) {
            Ok(f) => f,
            Err(why) => {
                let image = find_image(&image_dir, None, &stem);
                let skipped = match &image {
                    Some(i) => format!("; its image {} was skipped", i.display()),
                    None => String::new(),
                };
                notes
                    .rejected_labels
                    .push(format!("{}: {why}{skipped}", xml.display()));
                first_failure.get_or_insert_with(|| (xml.clone(), why));
                if let Some(i) = image {
                    claimed.entry(i).or_insert(None);
                }
                continue;
            }
        };
        parsed += 1;
        let Some(image) = find_image(&image_dir, file.filename.as_deref(), &stem) else {
            notes.labels_without_image.push(xml.clone());
            continue;
        };
        match claimed.get(&image) {
            Some(Some((other, _))) => notes.rejected_labels.push(format!(
                "{}: annotates {}, which {} already annotates; skipped",
                xml.display(),
                image.display(),
                other.display()
            )),
            Some(None) => {}
            None => {
                claimed.insert(image, Some((xml.clone(), file.objects)));
            }
        }
    }
    if parsed == 0 {
        let (path, why) = first_failure.expect("at least one xml file");
        return Err(Error::BadVoc {
            path,
            what: format!(
                "none of the {} annotation files could be read; the first problem: {why}",
                xml_files.len()
            ),
        });
    }

    let names: BTreeSet<&str> = claimed
        .values()
        .flatten()
        .flat_map(|(_, objs)| objs.iter().map(|(n, _)| n.as_str()))
        .collect();
    let class_names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let class_of = |n: &str| class_names.binary_search_by(|c| c.as_str().cmp(n)).unwrap() as u32;

    let mut all_images: BTreeSet<&PathBuf> = on_disk.iter().collect();
    all_images.extend(claimed.keys());
    let mut items = Vec::with_capacity(all_images.len());
    for image in all_images {
        let boxes = match claimed.get(image) {
            Some(None) => continue,
            Some(Some((_, objs))) => objs
                .iter()
                .map(|(n, [x0, y0, x1, y1])| SourceBox {
                    class: class_of(n),
                    x0: *x0,
                    y0: *y0,
                    x1: *x1,
                    y1: *y1,
                })
                .collect(),
            None => {
                notes.images_without_labels.push(image.clone());
                Vec::new()
            }
        };
        items.push(SourceItem {
            image: image.clone(),
            units: BoxUnits::Pixels,
            boxes,
        });
    }
    if items.is_empty() {
        return Err(Error::NoImages { dir: image_dir });
    }
    Ok(SourceDataset {
        items,
        class_names,
        notes,
    })
}

/// An accepted object: class name and 0-based corners `[x0, y0, x1, y1]` in pixels.
type Object = (String, [f32; 4]);

/// What one annotation file says.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct VocFile {
    filename: Option<String>,
    objects: Vec<Object>,
}

/// Reads and parses one file; `Err` (a reason) if the file as a whole is unusable.
fn read_annotation(path: &Path, rejected: &mut Vec<String>) -> Result<VocFile, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read ({e})"))?;
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    parse_annotation(&text, path, rejected)
}

/// Parses VOC XML; bad objects go to `rejected` as `file:line: reason`.
pub(crate) fn parse_annotation(
    text: &str,
    path: &Path,
    rejected: &mut Vec<String>,
) -> Result<VocFile, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| format!("malformed XML ({e})"))?;
    let root = doc.root_element();
    if root.tag_name().name() != "annotation" {
        return Err(format!(
            "the root element is <{}>, expected <annotation>",
            root.tag_name().name()
        ));
    }
    let filename = child(root, "filename")
        .map(text_of)
        .filter(|f| !f.is_empty());
    let mut objects = Vec::new();
    let objs = root
        .children()
        .filter(|c| c.is_element() && c.tag_name().name() == "object");
    for obj in objs {
        let line = doc.text_pos_at(obj.range().start).row;
        let parsed = (|| {
            let name = child(obj, "name").map(text_of).unwrap_or_default();
            if name.is_empty() {
                return Err("object without a <name>".to_owned());
            }
            let bb = child(obj, "bndbox")
                .ok_or_else(|| format!("object {} without <bndbox>", quoted(&name)))?;
            let mut v = [0f32; 4];
            for (k, tag) in ["xmin", "ymin", "xmax", "ymax"].iter().enumerate() {
                let t = child(bb, tag)
                    .map(text_of)
                    .ok_or(format!("<bndbox> without <{tag}>"))?;
                v[k] = match t.parse::<f32>() {
                    Ok(x) if x.is_finite() => x,
                    _ => return Err(format!("<{tag}> {} is not a number", quoted(&t))),
                };
            }
            let [xmin, ymin, xmax, ymax] = v;
            let corners = [xmin - 1.0, ymin - 1.0, xmax, ymax];
            if corners[2] <= corners[0] || corners[3] <= corners[1] {
                return Err(format!(
                    "empty box: xmin {xmin} xmax {xmax}, ymin {ymin} ymax {ymax}"
                ));
            }
            Ok((name, corners))
        })();
        match parsed {
            Ok(o) => objects.push(o),
            Err(why) => rejected.push(format!("{}:{line}: {why}; object skipped", path.display())),
        }
    }
    Ok(VocFile { filename, objects })
}

/// The first child element of `n` named `tag`.
fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, tag: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.tag_name().name() == tag)
}

fn text_of(n: roxmltree::Node<'_, '_>) -> String {
    n.text().unwrap_or("").trim().to_owned()
}

/// The image an annotation belongs to: `<filename>`, its base name, then `<stem>.<ext>`.
fn find_image(image_dir: &Path, filename: Option<&str>, xml_stem: &str) -> Option<PathBuf> {
    let mut tries = Vec::new();
    let mut stems = Vec::new();
    if let Some(f) = filename {
        let f = Path::new(f);
        tries.push(image_dir.join(f));
        if let Some(base) = f.file_name() {
            tries.push(image_dir.join(base));
        }
        if let Some(s) = f.file_stem() {
            stems.push(s.to_string_lossy().into_owned());
        }
    }
    stems.push(xml_stem.to_owned());
    for s in &stems {
        tries.extend(
            FALLBACK_EXTENSIONS
                .iter()
                .map(|e| image_dir.join(format!("{s}.{e}"))),
        );
    }
    tries.into_iter().find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RACCOON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/raccoon");

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn xml(filename: &str, objects: &[(&str, [&str; 4])]) -> String {
        let mut s = format!("<annotation>\n<filename>{filename}</filename>\n");
        for (name, [a, b, c, d]) in objects {
            s += &format!(
                "<object>\n<name>{name}</name><difficult>1</difficult>\n<bndbox><xmin>{a}</xmin>\
                 <ymin>{b}</ymin><xmax>{c}</xmax><ymax>{d}</ymax></bndbox>\n</object>\n"
            );
        }
        s + "</annotation>\n"
    }

    #[test]
    fn raccoon_has_200_images_each_with_a_box() {
        let dir = Path::new(RACCOON);
        if !dir.is_dir() {
            eprintln!("skipped: {RACCOON} not found (shared test data is absent)");
            return;
        }
        let ds = import(dir).unwrap();
        assert_eq!(ds.items.len(), 200);
        assert_eq!(ds.class_names, ["raccoon"]);
        assert!(ds
            .items
            .iter()
            .all(|i| !i.boxes.is_empty() && i.units == BoxUnits::Pixels));
        assert_eq!(ds.items.iter().map(|i| i.boxes.len()).sum::<usize>(), 217);
        assert_eq!(ds.notes, ImportNotes::default());
        assert!(ds.items.windows(2).all(|w| w[0].image < w[1].image));
        let one = ds
            .items
            .iter()
            .find(|i| i.image.ends_with("raccoon-1.jpg"))
            .unwrap();
        assert_eq!(
            one.boxes,
            [SourceBox {
                class: 0,
                x0: 80.0,
                y0: 87.0,
                x1: 522.0,
                y1: 408.0
            }]
        );
    }

    #[test]
    fn fixture_with_every_quirk() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let a = d.join("Annotations");
        let i = d.join("JPEGImages");
        write(
            &a.join("a.xml"),
            &xml(
                "a.jpg",
                &[
                    ("dog", ["1", "1", "10.5", "20"]),
                    ("cat", ["5", "5", "6", "6"]),
                ],
            ),
        );
        // `<filename>` is wrong: found through the XML's stem.
        write(
            &a.join("b.xml"),
            &xml(
                "renamed.jpg",
                &[("cat", ["3", "4", "2", "9"]), ("", ["1", "1", "2", "2"])],
            ),
        );
        write(
            &a.join("c.xml"),
            "<annotation><filename>c.jpg</filename><object>",
        );
        write(
            &a.join("d.xml"),
            &xml("d.jpg", &[("cat", ["1", "1", "2", "2"])]),
        );
        write(
            &a.join("e.xml"),
            &xml("a.jpg", &[("cat", ["1", "1", "2", "2"])]),
        );
        write(
            &a.join("f.xml"),
            &xml("f", &[("ant", ["1", "1", "x", "2"])]),
        );
        for n in ["a.jpg", "b.png", "c.jpg", "f.jpg", "g.jpg", ".h.jpg"] {
            write(&i.join(n), "x");
        }
        let ds = import(d).unwrap();
        assert_eq!(
            ds.class_names,
            ["cat", "dog"],
            "sorted, only names of imported objects"
        );
        let names: Vec<_> = ds
            .items
            .iter()
            .map(|i| i.image.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["a.jpg", "b.png", "f.jpg", "g.jpg"],
            "c.jpg skipped with its bad XML"
        );
        assert_eq!(
            ds.items[0].boxes,
            [
                SourceBox {
                    class: 1,
                    x0: 0.0,
                    y0: 0.0,
                    x1: 10.5,
                    y1: 20.0
                },
                SourceBox {
                    class: 0,
                    x0: 4.0,
                    y0: 4.0,
                    x1: 6.0,
                    y1: 6.0
                }
            ]
        );
        assert!(ds.items[1].boxes.is_empty() && ds.items[2].boxes.is_empty());
        assert_eq!(ds.notes.images_without_labels, [i.join("g.jpg")]);
        assert_eq!(ds.notes.labels_without_image, [a.join("d.xml")]);
        let r = &ds.notes.rejected_labels;
        assert_eq!(r.len(), 5, "{r:#?}");
        assert!(
            r[0].contains("b.xml:3:") && r[0].contains("empty box"),
            "{}",
            r[0]
        );
        assert!(
            r[1].contains("b.xml:7:") && r[1].contains("<name>"),
            "{}",
            r[1]
        );
        assert!(
            r[2].contains("c.xml: malformed XML") && r[2].contains("c.jpg was skipped"),
            "{}",
            r[2]
        );
        assert!(
            r[3].contains("e.xml") && r[3].contains("already annotates"),
            "{}",
            r[3]
        );
        assert!(
            r[4].contains("f.xml:3:") && r[4].contains("\"x\""),
            "{}",
            r[4]
        );
    }

    #[test]
    fn nothing_readable_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let err = import(d).unwrap_err();
        assert!(matches!(err, Error::NotADataset { .. }), "{err}");
        write(&d.join("annotations/a.xml"), "<notvoc/>");
        write(&d.join("images/a.jpg"), "x");
        let err = import(d).unwrap_err();
        assert!(matches!(err, Error::BadVoc { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("a.xml") && msg.contains("<notvoc>"), "{msg}");
    }
}
