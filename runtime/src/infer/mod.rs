//! Inference and evaluation: detections from the engines, mapped back to image pixels, and
//! COCO's mAP.

pub mod evaluate;
pub mod map;
pub mod nms;
pub mod predict;

pub use map::{MapAccumulator, MapReport, ObjectSize, Scored, SizeReport};

/// What can go wrong predicting or evaluating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Loader(#[from] crate::loader::Error),
    #[error(transparent)]
    Exec(#[from] crate::compute::exec::Error),
    #[error(transparent)]
    Load(#[from] crate::model::checkpoint::LoadError),
    /// An image that cannot be read (it names the file).
    #[error(transparent)]
    Image(#[from] crate::pack::Error),
    /// A frame or crop the frame pass cannot read.
    #[error(transparent)]
    Pixels(#[from] crate::pixels::PixelsError),
    #[error(transparent)]
    Graph(#[from] crate::model::GraphError),
    #[error(transparent)]
    Nms(#[from] nms::BadLimit),
    /// A model input no record layout holds.
    #[error(transparent)]
    Layout(#[from] crate::format::LayoutError),
    #[error("{0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
