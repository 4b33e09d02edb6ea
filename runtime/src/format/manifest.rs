//! `manifest.json`: the small file that ties a dataset's shards together.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{shard_file_name, Error, RecordLayout, Result, ShardHeader, FORMAT_VERSION};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const SOURCES_FILE: &str = "sources.txt";
const FORMAT_NAME: &str = "fulcrum-shards";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub file: String,
    pub records: u32,
}

/// What packing found and did, kept with the dataset so that `fulcrum inspect` can show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PackSummary {
    pub source: String,
    pub images: u64,
    pub background_images: u64,
    pub boxes: u64,
    pub boxes_clipped: u64,
    pub boxes_dropped: u64,
    pub boxes_over_max: u64,
    pub labels_without_image: u64,
    pub rejected_labels: u64,
    pub unreadable_images: u64,
    /// Groups of duplicate pictures among the records (the same file twice, or the same
    /// picture saved again; `hashes.txt` beside the manifest says which), and the records
    /// in them. Packs made before duplicates were looked for say 0.
    #[serde(default)]
    pub duplicate_groups: u64,
    #[serde(default)]
    pub duplicate_images: u64,
    /// How large the boxes are at the packed size (`None` in packs from before it was
    /// kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub box_sides: Option<super::box_sides::BoxSides>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub dataset_id: u64,
    pub width: u32,
    pub height: u32,
    pub channels: u32,
    pub max_boxes: u32,
    pub record_size: u32,
    pub records: u64,
    pub records_per_shard: u32,
    pub classes: Vec<String>,
    pub shards: Vec<ShardEntry>,
    pub summary: PackSummary,
}

impl Manifest {
    pub fn new(layout: &RecordLayout, records_per_shard: u32, classes: Vec<String>) -> Self {
        Manifest {
            format: FORMAT_NAME.to_owned(),
            version: FORMAT_VERSION,
            dataset_id: 0,
            width: layout.width,
            height: layout.height,
            channels: layout.channels,
            max_boxes: layout.max_boxes,
            record_size: layout.record_size as u32,
            records: 0,
            records_per_shard,
            classes,
            shards: Vec::new(),
            summary: PackSummary::default(),
        }
    }

    pub fn layout(&self) -> RecordLayout {
        RecordLayout::new(self.width, self.height, self.channels, self.max_boxes)
            .expect("validated on load")
    }

    pub fn num_classes(&self) -> u32 {
        self.classes.len() as u32
    }

    /// The header shard `index` must carry.
    pub fn shard_header(&self, index: u32) -> ShardHeader {
        ShardHeader {
            record_size: self.record_size,
            record_count: self.shards[index as usize].records,
            width: self.width,
            height: self.height,
            channels: self.channels,
            max_boxes: self.max_boxes,
            num_classes: self.num_classes(),
            shard_index: index,
            first_record: index as u64 * self.records_per_shard as u64,
            dataset_id: self.dataset_id,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("manifest serialises") + "\n"
    }

    /// Reads and checks `DIR/manifest.json` (not the shards: see `ShardHeader`).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                Error::BadManifest {
                    path: path.clone(),
                    what: "missing: is this a directory written by `fulcrum pack`?".into(),
                }
            } else {
                Error::Io {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        Self::parse(&text, &path)
    }

    /// Parses and validates the text of a `manifest.json` (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let m: Manifest = serde_json::from_str(text).map_err(|e| Error::BadManifest {
            path: path.to_owned(),
            what: e.to_string(),
        })?;
        m.validate(path)?;
        Ok(m)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |what: String| {
            Err(Error::BadManifest {
                path: path.to_owned(),
                what,
            })
        };
        if self.format != FORMAT_NAME {
            return bad(format!(
                "format is {}, expected {FORMAT_NAME:?}",
                crate::text::quoted(&self.format)
            ));
        }
        if self.version != FORMAT_VERSION {
            return Err(Error::BadVersion {
                path: path.to_owned(),
                found: self.version,
                expected: FORMAT_VERSION,
            });
        }
        let layout = match RecordLayout::new(self.width, self.height, self.channels, self.max_boxes)
        {
            Ok(l) => l,
            Err(e) => return bad(e.to_string()),
        };
        if layout.record_size as u32 != self.record_size {
            return bad("record size does not match the layout".into());
        }
        if self.classes.is_empty() {
            return bad("no classes".into());
        }
        if self.records_per_shard == 0 {
            return bad("records_per_shard is 0".into());
        }
        let total: u64 = self.shards.iter().map(|s| s.records as u64).sum();
        if total != self.records {
            return bad(format!(
                "shards hold {total} records, manifest says {}",
                self.records
            ));
        }
        for (i, s) in self.shards.iter().enumerate() {
            if s.file != shard_file_name(i as u32) {
                return bad(format!(
                    "shard {i} is named {}",
                    crate::text::quoted(&s.file)
                ));
            }
            let last = i + 1 == self.shards.len();
            if (!last && s.records != self.records_per_shard) || s.records > self.records_per_shard
            {
                return bad(format!("shard {i} holds {} records", s.records));
            }
        }
        Ok(())
    }

    pub fn shard_path(&self, dir: &Path, index: u32) -> PathBuf {
        dir.join(&self.shards[index as usize].file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_and_reject() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RecordLayout::new(64, 64, 3, 8).unwrap();
        let mut m = Manifest::new(&layout, 10, vec!["a".into(), "b".into()]);
        m.shards = vec![
            ShardEntry {
                file: shard_file_name(0),
                records: 10,
            },
            ShardEntry {
                file: shard_file_name(1),
                records: 3,
            },
        ];
        m.records = 13;
        std::fs::write(dir.path().join(MANIFEST_FILE), m.to_json()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
        assert_eq!(m.shard_header(1).first_record, 10);

        m.records = 14;
        std::fs::write(dir.path().join(MANIFEST_FILE), m.to_json()).unwrap();
        let err = Manifest::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("manifest.json") && err.contains("13 records"),
            "{err}"
        );

        std::fs::write(dir.path().join(MANIFEST_FILE), "{not json").unwrap();
        assert!(matches!(
            Manifest::load(dir.path()),
            Err(Error::BadManifest { .. })
        ));
        let empty = tempfile::tempdir().unwrap();
        let err = Manifest::load(empty.path()).unwrap_err().to_string();
        assert!(err.contains("fulcrum pack"), "{err}");
    }
}
