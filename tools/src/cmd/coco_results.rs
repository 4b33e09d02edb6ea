//! Detections in COCO's results format, the input of pycocotools' `COCO.loadRes` /
//! `COCOeval` and of other standard scorers: one JSON array of
//! `{"image_id", "category_id", "bbox": [x, y, width, height], "score"}` in source pixels.

use std::path::{Path, PathBuf};

use anyhow::bail;
use fulcrum::pack::coco::CocoIds;
use serde_json::Value;

/// The results of a run over a list of images, written at its end.
pub struct CocoResults {
    /// Per input image, its `image_id`.
    image_ids: Vec<Value>,
    /// Per class, its `category_id`.
    category_ids: Vec<Value>,
    rows: Vec<Value>,
}

impl CocoResults {
    /// Ids for `files` and `classes`: looked up in `ids` (a COCO annotations file, by file and
    /// class name; anything it lacks is an error now, not a silently unscored result), else
    /// each image's number in its file name when every name is one (COCO's own naming,
    /// `000000000009.jpg` → 9), else its position in `files` from 1, and class indices.
    pub fn new(
        files: &[PathBuf],
        classes: &[String],
        ids: Option<(&Path, CocoIds)>,
    ) -> anyhow::Result<Self> {
        let base_name = |f: &PathBuf| {
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let (image_ids, category_ids) = match ids {
            Some((annotations, ids)) => {
                let at = annotations.display();
                let image_ids = (files.iter())
                    .map(|f| match ids.images.get(&base_name(f)) {
                        Some(id) => Ok(id.clone()),
                        None => bail!(
                            "{}: no image of that name in {at}; give the images it lists",
                            f.display()
                        ),
                    })
                    .collect::<anyhow::Result<_>>()?;
                let category_ids = (classes.iter())
                    .map(|c| match ids.categories.get(c) {
                        Some(id) => Ok(id.clone()),
                        None => bail!(
                            "the checkpoint's class {} is not a category of {at} (it has {})",
                            fulcrum::text::quoted(c),
                            ids.categories.len()
                        ),
                    })
                    .collect::<anyhow::Result<_>>()?;
                (image_ids, category_ids)
            }
            None => {
                let numbers: Option<Vec<u64>> = (files.iter())
                    .map(|f| f.file_stem()?.to_str()?.parse().ok())
                    .collect();
                let unique = numbers.as_ref().is_some_and(|n| {
                    let mut sorted = n.clone();
                    sorted.sort_unstable();
                    sorted.windows(2).all(|w| w[0] != w[1])
                });
                let image_ids = match numbers {
                    Some(numbers) if unique => {
                        log::info!("COCO results: image ids from the file names' numbers");
                        numbers.into_iter().map(Value::from).collect()
                    }
                    _ => {
                        log::info!(
                            "COCO results: image ids are positions in the input list (1 = {}); \
                             --coco-ids ANNOTATIONS takes them from a COCO file instead",
                            files.first().map(base_name).unwrap_or_default()
                        );
                        (1..=files.len() as u64).map(Value::from).collect()
                    }
                };
                (
                    image_ids,
                    (0..classes.len() as u64).map(Value::from).collect(),
                )
            }
        };
        Ok(CocoResults {
            image_ids,
            category_ids,
            rows: Vec::new(),
        })
    }

    /// Adds the detections `(class, score, [x0, y0, x1, y1])` of input image `index`.
    pub fn add(&mut self, index: usize, detections: impl Iterator<Item = (u32, f32, [f32; 4])>) {
        for (class, score, [x0, y0, x1, y1]) in detections {
            let Some(category) = self.category_ids.get(class as usize) else {
                continue;
            };
            let round = |v: f32| (f64::from(v) * 100.0).round() / 100.0;
            self.rows.push(serde_json::json!({
                "image_id": self.image_ids[index],
                "category_id": category,
                "bbox": [round(x0), round(y0), round(x1 - x0), round(y1 - y0)],
                "score": (f64::from(score) * 1e5).round() / 1e5,
            }));
        }
    }

    /// The detections added so far.
    pub fn detections(&self) -> usize {
        self.rows.len()
    }

    /// Writes the array to `path`, atomically.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        crate::output_file::write(path, (serde_json::to_string(&self.rows)? + "\n").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names
            .iter()
            .map(|n| PathBuf::from("imgs").join(n))
            .collect()
    }

    #[test]
    fn ids_come_from_numbered_names_else_positions() {
        let classes = ["cat".to_owned(), "dog".to_owned()];
        let mut r =
            CocoResults::new(&paths(&["000000000009.jpg", "42.png"]), &classes, None).unwrap();
        r.add(1, [(1, 0.5, [10.0, 20.0, 40.0, 60.0])].into_iter());
        assert_eq!(
            r.rows[0],
            serde_json::json!({"image_id": 42, "category_id": 1,
                "bbox": [10.0, 20.0, 30.0, 40.0], "score": 0.5})
        );
        // One name without a number: positions for all.
        let mut r = CocoResults::new(&paths(&["9.jpg", "b.jpg"]), &classes, None).unwrap();
        r.add(0, [(0, 0.25, [0.0, 0.0, 1.0, 1.0])].into_iter());
        assert_eq!(r.rows[0]["image_id"], 1);
        // Repeated numbers (9.jpg, 9.png) are not ids either.
        let r = CocoResults::new(&paths(&["9.jpg", "9.png"]), &classes, None).unwrap();
        assert_eq!(r.image_ids, vec![Value::from(1), Value::from(2)]);
    }

    #[test]
    fn an_annotations_file_gives_ids_and_refuses_what_it_lacks() {
        let mut ids = CocoIds::default();
        ids.images.insert("a.jpg".into(), Value::from(7));
        ids.images.insert("b.jpg".into(), Value::from("b-id"));
        ids.categories.insert("cat".into(), Value::from(17));
        ids.categories.insert("dog".into(), Value::from(18));
        let ann = Path::new("instances.json");
        let classes = ["cat".to_owned(), "dog".to_owned()];
        let mut r = CocoResults::new(
            &paths(&["a.jpg", "b.jpg"]),
            &classes,
            Some((ann, ids.clone())),
        )
        .unwrap();
        r.add(1, [(1, 0.9, [0.0, 0.0, 2.0, 2.0])].into_iter());
        assert_eq!(r.rows[0]["image_id"], "b-id");
        assert_eq!(r.rows[0]["category_id"], 18);

        let missing_image =
            CocoResults::new(&paths(&["c.jpg"]), &classes, Some((ann, ids.clone())));
        let e = missing_image.err().unwrap().to_string();
        assert!(e.contains("c.jpg") && e.contains("instances.json"), "{e}");
        let bird = ["bird".to_owned()];
        let missing_class = CocoResults::new(&paths(&["a.jpg"]), &bird, Some((ann, ids)));
        let e = missing_class.err().unwrap().to_string();
        assert!(e.contains("\"bird\""), "{e}");
    }
}
