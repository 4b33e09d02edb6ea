//! Inference and evaluation: detections from the engines, mapped back to image pixels, and
//! mAP@0.5.

pub mod evaluate;
pub mod map;
pub mod predict;

pub use map::{MapAccumulator, MapReport, Scored};
