//! Dataset import: YOLO txt, Pascal VOC XML, COCO JSON and the synthetic set → shards.
pub mod coco;
pub mod duplicates;
mod error;
pub mod letterbox;
pub mod source;
pub mod synthetic;
pub mod voc;
pub mod yolo;

pub use error::{Error, Result};
mod packer;

pub use packer::{detect, pack, Holdout, PackOptions, PackReport, Source, DEFAULT_MAX_BOXES};
