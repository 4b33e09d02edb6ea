//! What an importer produces: a list of images with their boxes, before any pixel is decoded.
//!
//! Importers (YOLO txt, Pascal VOC XML, COCO JSON) only read label files; decoding, letterboxing
//! and writing happen later, in parallel, in `pack`. Boxes keep the units of their source format
//! until the image's real size is known (a VOC `<size>` or COCO `width` can be wrong or missing).

use std::path::PathBuf;

/// The unit of a box's coordinates as the label file gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxUnits {
    /// Fractions of the image width/height, in [0, 1] when valid (YOLO txt).
    Normalized,
    /// Pixels of the original image (Pascal VOC, COCO).
    Pixels,
}

/// One labelled box: corners `(x0, y0)`–`(x1, y1)` in the item's [`BoxUnits`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceBox {
    pub class: u32,
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

/// One image to pack and its labels. An empty `boxes` is a background image.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceItem {
    pub image: PathBuf,
    pub units: BoxUnits,
    pub boxes: Vec<SourceBox>,
}

/// Problems an importer met and handled without failing; they end up in the pack summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportNotes {
    /// Images that have no label file: packed as background (no boxes).
    pub images_without_labels: Vec<PathBuf>,
    /// Label files (or annotation entries) that name no existing image: skipped.
    pub labels_without_image: Vec<PathBuf>,
    /// Label lines or objects that could not be used (bad class id, unparsable numbers…),
    /// each as "file:line: reason" so that the user can find and fix them.
    pub rejected_labels: Vec<String>,
}

/// A whole imported split: items in a deterministic order (sorted by image path) and class names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceDataset {
    pub items: Vec<SourceItem>,
    /// Class names indexed by class id. Never empty for a dataset with boxes.
    pub class_names: Vec<String>,
    pub notes: ImportNotes,
}

/// File extensions (any case) that importers treat as images. The decoder goes by content, so
/// a PNG named `.jpg` still decodes.
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// Whether `path` has one of the [`IMAGE_EXTENSIONS`].
pub fn is_image_path(path: &std::path::Path) -> bool {
    has_extension(path, &IMAGE_EXTENSIONS)
}

/// Extensions of image formats that are not read (GIF, BMP, WebP, TIFF, HEIF, AVIF). Folder
/// importers list them with the images so that packing names each one and why it was left
/// out (the decoder refuses them with what to do), and their label files are not taken for
/// labels without an image.
pub const UNSUPPORTED_IMAGE_EXTENSIONS: [&str; 8] =
    ["gif", "bmp", "webp", "tif", "tiff", "heic", "heif", "avif"];

/// Whether `path` looks like an image, read or not ([`IMAGE_EXTENSIONS`] or
/// [`UNSUPPORTED_IMAGE_EXTENSIONS`]).
pub fn is_any_image_path(path: &std::path::Path) -> bool {
    is_image_path(path) || has_extension(path, &UNSUPPORTED_IMAGE_EXTENSIONS)
}

pub(crate) fn has_extension(path: &std::path::Path, exts: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| exts.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Files under `dir` (into subfolders when `recursive`) for which `keep` holds, sorted.
/// Hidden entries (a name starting with `.`) are skipped, as are entries whose metadata cannot
/// be read (a dangling symlink); an unreadable `dir` itself is an error. A folder reached twice
/// through links (a loop, or two links to one folder) is listed once.
pub(crate) fn list_files(
    dir: &std::path::Path,
    recursive: bool,
    keep: &dyn Fn(&std::path::Path) -> bool,
) -> super::Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let folder_id = |meta: &std::fs::Metadata| (meta.dev(), meta.ino());
    let root = std::fs::metadata(dir).map_err(|e| super::Error::io(dir, e))?;
    let mut listed = std::collections::HashSet::from([folder_id(&root)]);
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| super::Error::io(&d, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| super::Error::io(&d, e))?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                log::warn!(
                    "{}: cannot read its metadata (dangling link?); skipped",
                    path.display()
                );
                continue;
            };
            if meta.is_dir() {
                if !recursive {
                    continue;
                }
                if listed.insert(folder_id(&meta)) {
                    stack.push(path);
                } else {
                    log::warn!(
                        "{}: a link to a folder already listed (a loop?); skipped",
                        path.display()
                    );
                }
            } else if meta.is_file() && keep(&path) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_reached_again_through_links_are_listed_once() {
        let tmp = tempfile::tempdir().unwrap();
        let images = tmp.path().join("images");
        std::fs::create_dir_all(images.join("sub")).unwrap();
        std::fs::write(images.join("a.jpg"), b"").unwrap();
        std::fs::write(images.join("sub/b.jpg"), b"").unwrap();
        // A loop back to the top, and a second way into `sub`.
        std::os::unix::fs::symlink("..", images.join("sub/loop")).unwrap();
        std::os::unix::fs::symlink("sub", images.join("again")).unwrap();
        std::os::unix::fs::symlink("missing", images.join("dangling.jpg")).unwrap();

        let listed = list_files(&images, true, &is_image_path).unwrap();
        let names: Vec<_> = listed
            .iter()
            .map(|p| p.strip_prefix(&images).unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"a.jpg"), "{names:?}");
        assert!(names.iter().any(|n| n.ends_with("b.jpg")), "{names:?}");

        let flat = list_files(&images, false, &is_image_path).unwrap();
        assert_eq!(flat, vec![images.join("a.jpg")]);
    }
}
