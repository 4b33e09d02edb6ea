//! Packing: decode each image once, letterbox it, write fixed-size records into shards.
//!
//! Record `i` always lands at the same place (shard `i / records_per_shard`), whichever thread
//! packs it, so the output is byte-identical for the same input and options at any thread
//! count. The dataset is written into `OUT.fulcrum-tmp` and renamed into place when complete:
//! an interrupted pack leaves no half-written dataset behind.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::duplicates::{hashes_text, Groups, ImageHash, HASHES_FILE};
use super::letterbox::{self, BoxStats};
use super::source::{SourceDataset, SourceItem};
use super::{coco, synthetic, voc, yolo, Error, Result};
use crate::durable::DirLock;
use crate::format::box_sides::BoxSides;
use crate::format::{
    shard_file_name, Manifest, PackSummary, RecordBox, RecordLayout, RecordMeta, ShardEntry,
    HEADER_SIZE, MANIFEST_FILE, SOURCES_FILE,
};

/// Where the images and labels come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Detect the format from what the path holds.
    Auto(PathBuf),
    Yolo {
        dir: PathBuf,
        split: Option<String>,
    },
    Voc(PathBuf),
    Coco {
        json: PathBuf,
        images: Option<PathBuf>,
    },
    /// The built-in procedural dataset: `count` images from `seed`.
    Synthetic {
        count: u64,
        seed: u64,
    },
}

/// `--max-boxes` unless told otherwise: COCO's cap on detections per image, enough for the
/// 30–90 boxes of crowd photos (a box is 20 bytes of a record).
pub const DEFAULT_MAX_BOXES: u32 = 100;

#[derive(Debug, Clone, PartialEq)]
pub struct PackOptions {
    pub source: Source,
    pub out: PathBuf,
    /// Model input size: images are letterboxed to `size × size`.
    pub size: u32,
    pub max_boxes: u32,
    pub records_per_shard: u32,
    /// Packing threads (0: one per core).
    pub threads: usize,
    /// Replace `out` if it exists.
    pub force: bool,
    /// Pack only one side of a deterministic split of the source's images.
    pub holdout: Option<Holdout>,
}

/// A train/validation split fixed by a seed: an image is held out when a hash of its file
/// name and the seed falls below `fraction`. Duplicates (the same file twice, or the same
/// picture re-encoded or resized: [`super::duplicates`]) go together, on the side of the
/// group's first file name, so that no picture is both trained on and held out. The same
/// pictures, names, fraction and seed always give the same split, wherever the dataset lives
/// and whatever order the importer lists it in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Holdout {
    /// Fraction of the images held out, in `(0, 1)`.
    pub fraction: f64,
    pub seed: u64,
    /// Pack the held-out images (validation) rather than the rest (training).
    pub take_held_out: bool,
}

impl Holdout {
    /// Whether the image at `path` is held out.
    pub fn holds_out(&self, path: &Path) -> bool {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        // FNV-1a of the name, mixed with the seed: stable across builds and platforms.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let x = crate::base::mix64(h ^ crate::base::mix64(self.seed));
        let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
        unit < self.fraction
    }
}

impl PackOptions {
    pub fn new(source: Source, out: impl Into<PathBuf>) -> Self {
        PackOptions {
            source,
            out: out.into(),
            size: 128,
            max_boxes: DEFAULT_MAX_BOXES,
            records_per_shard: 1024,
            threads: 0,
            force: false,
            holdout: None,
        }
    }
}

/// What a finished pack says to the user.
#[derive(Debug, Clone)]
pub struct PackReport {
    pub manifest: Manifest,
    /// Human-readable notes: skipped files, rejected label lines (first few of each).
    pub warnings: Vec<String>,
    /// With `--holdout`: the groups of duplicate pictures found in the whole source, each
    /// kept on one side of the split.
    pub holdout_duplicates: Option<Groups>,
}

/// Work every thread reports back, per record.
struct Packed {
    crc: u32,
    stats: BoxStats,
    background: bool,
    /// The picture's hashes (none for synthetic records).
    hash: Option<ImageHash>,
    /// Each kept box's longer side, in pixels at the packed size.
    sides: Vec<f32>,
}

/// Packs a dataset; `progress(done, total)` is called as records are written.
pub fn pack(options: &PackOptions, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<PackReport> {
    if !(8..=RecordLayout::MAX_SIDE).contains(&options.size) {
        return Err(Error::BadOption(format!(
            "--size {} outside 8..={}",
            options.size,
            RecordLayout::MAX_SIDE
        )));
    }
    if options.records_per_shard == 0 {
        return Err(Error::BadOption(
            "--shard-records must be at least 1".into(),
        ));
    }
    let layout = RecordLayout::new(options.size, options.size, 3, options.max_boxes)?;
    if options.out.exists() && !options.force {
        return Err(Error::OutputExists {
            path: options.out.clone(),
        });
    }
    // Held until the new dataset is in place: nobody starts reading the old one meanwhile.
    let old_lock = lock_existing_output(&options.out)?;
    let (mut dataset, mut source_name) = import(&options.source)?;
    let mut holdout_duplicates = None;
    if let Some(h) = &options.holdout {
        if matches!(options.source, Source::Synthetic { .. }) {
            return Err(Error::BadOption(
                "--holdout splits a real dataset; for held-out synthetic data pack another set \
                 with a different --seed"
                    .into(),
            ));
        }
        if !(h.fraction > 0.0 && h.fraction < 1.0) {
            return Err(Error::BadOption(format!(
                "--holdout {} must be between 0 and 1 (a fraction of the images)",
                h.fraction
            )));
        }
        holdout_duplicates = Some(split_keeping_duplicates(&mut dataset, h, options.threads));
        source_name = format!(
            "{source_name} ({} of a {:.0} % hold-out, seed {})",
            if h.take_held_out {
                "held-out part"
            } else {
                "rest"
            },
            100.0 * h.fraction,
            h.seed
        );
    }
    let count = match &options.source {
        Source::Synthetic { count, .. } => *count,
        _ => dataset.items.len() as u64,
    };
    if count == 0 {
        return Err(Error::Empty { what: source_name });
    }
    let classes = match (&options.source, dataset.class_names.is_empty()) {
        (Source::Synthetic { .. }, _) => synthetic::CLASSES.iter().map(|c| c.to_string()).collect(),
        (_, false) => dataset.class_names.clone(),
        // Only background images and no class list: one placeholder class keeps the format valid.
        (_, true) => vec!["object".to_owned()],
    };

    let tmp = tmp_dir_for(&options.out);
    // The lock stays on the folder through the rename: the new dataset is ours until we exit.
    let _tmp_lock = claim_tmp_dir(&tmp, &options.out)?;
    let written = write_dataset(
        options,
        &layout,
        &dataset,
        count,
        classes,
        &source_name,
        &tmp,
        progress,
    )
    .and_then(|report| {
        // Another pack may have put a dataset there while this one worked.
        let late_lock = match (&old_lock, options.out.exists(), options.force) {
            (None, true, false) => Err(Error::OutputExists {
                path: options.out.clone(),
            }),
            (None, true, true) => lock_existing_output(&options.out),
            _ => Ok(None),
        }?;
        Ok((report, late_lock))
    });
    let (report, _late_lock) = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    publish(&tmp, &options.out)?;
    Ok(PackReport {
        holdout_duplicates,
        ..report
    })
}

/// Keeps the side of `holdout` that it asks for, every group of duplicates whole: each picture
/// is hashed (on `threads` threads, 0: every core), and a group goes where its first file
/// name (the smallest) would. Pictures that cannot be read go by their own name (packing then
/// names them as unreadable). Returns the groups found among all the pictures.
fn split_keeping_duplicates(
    dataset: &mut SourceDataset,
    holdout: &Holdout,
    threads: usize,
) -> Groups {
    let items = &dataset.items;
    let hashes: Vec<Mutex<Option<ImageHash>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    std::thread::scope(|scope| {
        for _ in 0..threads.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let Ok(bytes) = fs::read(&item.image) else {
                    continue;
                };
                if let Ok(picture) = letterbox::decode_image_bytes(&bytes, &item.image) {
                    *hashes[i].lock().unwrap() = Some(ImageHash::of(&bytes, &picture));
                }
            });
        }
    });
    let hashes: Vec<Option<ImageHash>> = hashes
        .into_iter()
        .map(|m| m.into_inner().unwrap())
        .collect();
    let groups = Groups::find(&hashes);
    let name = |i: usize| items[i].image.file_name().unwrap_or_default().to_owned();
    let mut decides: Vec<usize> = (0..items.len()).collect();
    for group in &groups.groups {
        let first = *group
            .iter()
            .min_by_key(|&&i| name(i))
            .expect("groups are not empty");
        for &i in group {
            decides[i] = first;
        }
    }
    let keep: Vec<bool> = decides
        .iter()
        .map(|&d| holdout.holds_out(&items[d].image) == holdout.take_held_out)
        .collect();
    let mut k = keep.iter();
    dataset.items.retain(|_| *k.next().unwrap());
    groups
}

/// An exclusive lock on the dataset `pack --force` will replace; refused while anyone reads it.
fn lock_existing_output(out: &Path) -> Result<Option<DirLock>> {
    if !out.is_dir() {
        return Ok(None);
    }
    match DirLock::try_lock(out, true) {
        Ok(Some(lock)) => Ok(Some(lock)),
        // Readers and a replacing pack both hold it; a pack also holds its working folder.
        Ok(None) if is_being_packed(out) => Err(Error::OutputBeingPacked {
            path: out.to_owned(),
        }),
        Ok(None) => Err(Error::OutputInUse {
            path: out.to_owned(),
        }),
        Err(e) => Err(Error::io(out, e)),
    }
}

/// Whether another `pack` is writing the replacement of `out` now.
fn is_being_packed(out: &Path) -> bool {
    matches!(DirLock::try_lock(&tmp_dir_for(out), false), Ok(None))
}

/// Creates (or takes over, when a crashed pack left it) the folder the new dataset is written
/// in, locked so that a second `pack` to the same `--out` is refused instead of clobbering it.
fn claim_tmp_dir(tmp: &Path, out: &Path) -> Result<DirLock> {
    if let Some(parent) = tmp.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let created = match fs::create_dir(tmp) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(Error::io(tmp, e)),
    };
    let lock = DirLock::try_lock(tmp, true)
        .map_err(|e| Error::io(tmp, e))?
        .ok_or_else(|| Error::OutputBeingPacked {
            path: out.to_owned(),
        })?;
    if !created {
        for entry in fs::read_dir(tmp).map_err(|e| Error::io(tmp, e))? {
            let path = entry.map_err(|e| Error::io(tmp, e))?.path();
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| Error::io(&path, e))?;
        }
    }
    Ok(lock)
}

fn import(source: &Source) -> Result<(SourceDataset, String)> {
    Ok(match source {
        Source::Synthetic { count, seed } => (
            SourceDataset::default(),
            format!("synthetic (seed {seed}, {count} images)"),
        ),
        Source::Yolo { dir, split } => (
            yolo::import(dir, split.as_deref())?,
            dir.display().to_string(),
        ),
        Source::Voc(dir) => (voc::import(dir)?, dir.display().to_string()),
        Source::Coco { json, images } => (
            coco::import(json, images.as_deref())?,
            json.display().to_string(),
        ),
        Source::Auto(path) => return import(&detect(path)?),
    })
}

/// Guesses the dataset format from what `path` holds.
pub fn detect(path: &Path) -> Result<Source> {
    if path.is_file() {
        if coco::looks_like_coco(path) {
            return Ok(Source::Coco {
                json: path.to_owned(),
                images: None,
            });
        }
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            return Ok(Source::Yolo {
                dir: path.to_owned(),
                split: None,
            });
        }
    } else if path.is_dir() {
        let has = |name: &str| path.join(name).exists();
        if has("annotations") || has("Annotations") {
            return Ok(Source::Voc(path.to_owned()));
        }
        if has("data.yaml") || has("labels") {
            return Ok(Source::Yolo {
                dir: path.to_owned(),
                split: None,
            });
        }
        for name in [
            "annotations.json",
            "instances.json",
            "_annotations.coco.json",
        ] {
            if coco::looks_like_coco(&path.join(name)) {
                return Ok(Source::Coco {
                    json: path.join(name),
                    images: None,
                });
            }
        }
    } else {
        return Err(Error::io(
            path,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    Err(Error::NotADataset {
        path: path.to_owned(),
        what_we_looked_for: "data.yaml or labels/ (YOLO), annotations/*.xml (Pascal VOC), a COCO .json; or use --synthetic N".into(),
    })
}

fn tmp_dir_for(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_owned();
    name.push(".fulcrum-tmp");
    out.with_file_name(name)
}

#[allow(clippy::too_many_arguments)]
fn write_dataset(
    options: &PackOptions,
    layout: &RecordLayout,
    dataset: &SourceDataset,
    count: u64,
    classes: Vec<String>,
    source_name: &str,
    dir: &Path,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PackReport> {
    let per_shard = options.records_per_shard as u64;
    let shards = count.div_ceil(per_shard);
    let mut files = Vec::with_capacity(shards as usize);
    for s in 0..shards {
        let path = dir.join(shard_file_name(s as u32));
        let records = per_shard.min(count - s * per_shard);
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        file.set_len(HEADER_SIZE as u64 + records * layout.record_size as u64)
            .map_err(|e| Error::io(&path, e))?;
        files.push((path, file));
    }

    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let results: Vec<Mutex<Option<Result<Packed>>>> =
        (0..count).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.min(count as usize) {
            scope.spawn(|| {
                let mut record = vec![0u8; layout.record_size];
                let mut image = vec![0u8; layout.image_bytes];
                let mut boxes: Vec<RecordBox> = Vec::with_capacity(layout.max_boxes as usize);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i as u64 >= count || first_error.lock().unwrap().is_some() {
                        break;
                    }
                    let outcome = match &options.source {
                        Source::Synthetic { seed, .. } => Ok(pack_synthetic(
                            layout,
                            *seed,
                            i as u64,
                            &mut record,
                            &mut image,
                            &mut boxes,
                        )),
                        _ => pack_item(
                            layout,
                            &dataset.items[i],
                            i as u64,
                            &mut record,
                            &mut image,
                            &mut boxes,
                        ),
                    };
                    if outcome.is_ok() {
                        let (path, file) = &files[(i as u64 / per_shard) as usize];
                        let offset =
                            HEADER_SIZE as u64 + (i as u64 % per_shard) * layout.record_size as u64;
                        if let Err(e) = file.write_all_at(&record, offset) {
                            first_error
                                .lock()
                                .unwrap()
                                .get_or_insert(Error::io(path, e));
                        }
                    }
                    *results[i].lock().unwrap() = Some(outcome);
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d.is_multiple_of(64) || d as u64 == count {
                        progress(d as u64, count);
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(e);
    }

    // Unreadable images are named and left out; the records after them move down so that
    // indices stay dense. Rare, so done serially here rather than complicating the workers.
    let outcomes: Vec<_> = results
        .into_iter()
        .map(|m| m.into_inner().unwrap().expect("every record packed"))
        .collect();
    let mut warnings = Vec::new();
    let mut summary = PackSummary {
        source: source_name.to_owned(),
        ..PackSummary::default()
    };
    // Images that had more boxes than --max-boxes, and the most boxes one image had.
    let (mut crowded, mut most_boxes) = (0u64, 0usize);
    let mut kept: Vec<(u64, u32)> = Vec::with_capacity(outcomes.len()); // (old index, crc)
    let mut hashes: Vec<Option<ImageHash>> = Vec::with_capacity(outcomes.len());
    let mut sources = String::new();
    let mut sides = Vec::new();
    for (i, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Ok(p) => {
                summary.images += 1;
                summary.background_images += p.background as u64;
                summary.boxes += p.stats.kept as u64;
                summary.boxes_clipped += p.stats.clipped as u64;
                summary.boxes_dropped += p.stats.dropped as u64;
                summary.boxes_over_max += p.stats.over_max as u64;
                crowded += (p.stats.over_max > 0) as u64;
                most_boxes = most_boxes.max(p.stats.kept + p.stats.over_max);
                kept.push((i as u64, p.crc));
                hashes.push(p.hash);
                sides.extend_from_slice(&p.sides);
                match &options.source {
                    Source::Synthetic { seed, .. } => {
                        sources.push_str(&format!("synthetic:{seed}:{i}\n"))
                    }
                    _ => sources.push_str(&format!("{}\n", dataset.items[i].image.display())),
                }
            }
            Err(why) => {
                summary.unreadable_images += 1;
                warnings.push(why.to_string());
            }
        }
    }
    if summary.boxes_over_max > 0 {
        // Loud: a detector never learns the objects it is not shown, and crowds are what
        // a robot's camera sees.
        warnings.push(format!(
            "{} labelled boxes in {crowded} images are NOT in the pack: they were over \
             --max-boxes {} (the smallest boxes of each image were left out); the detector \
             will not learn them. Pack again with --max-boxes {most_boxes} (the most boxes in \
             one image) to keep them all",
            summary.boxes_over_max, layout.max_boxes
        ));
    }
    if kept.is_empty() {
        // Say which images, and why: a folder whose only image is unreadable must not end in
        // a bare "nothing to pack".
        let shown = 3;
        let mut what = format!("{source_name}: no readable image");
        for why in warnings.iter().take(shown) {
            what += &format!("\n  {why}");
        }
        if warnings.len() > shown {
            what += &format!(
                "\n  (and {} more unreadable images)",
                warnings.len() - shown
            );
        }
        return Err(Error::Empty { what });
    }
    let total = kept.len() as u64;
    if total != count {
        compact(layout, &files, per_shard, &kept)?;
    }

    let notes = &dataset.notes;
    summary.labels_without_image = notes.labels_without_image.len() as u64;
    summary.rejected_labels = notes.rejected_labels.len() as u64;
    note_list(
        &mut warnings,
        "label file without an image (skipped)",
        notes
            .labels_without_image
            .iter()
            .map(|p| p.display().to_string()),
    );
    note_list(
        &mut warnings,
        "rejected label",
        notes.rejected_labels.iter().cloned(),
    );

    let inside = Groups::find(&hashes);
    summary.duplicate_groups = inside.groups.len() as u64;
    summary.duplicate_images = inside.images() as u64;
    summary.box_sides = Some(BoxSides::of(&mut sides));
    let mut manifest = Manifest::new(layout, options.records_per_shard, classes);
    manifest.records = total;
    manifest.summary = summary;
    manifest.dataset_id = dataset_id(&manifest, kept.iter().map(|&(_, crc)| crc));
    let shard_count = total.div_ceil(per_shard) as usize;
    for s in 0..shard_count {
        let records = per_shard.min(total - s as u64 * per_shard) as u32;
        manifest.shards.push(ShardEntry {
            file: shard_file_name(s as u32),
            records,
        });
    }
    for (s, (path, file)) in files.iter().enumerate() {
        if s >= shard_count {
            fs::remove_file(path).map_err(|e| Error::io(path, e))?;
            continue;
        }
        let header = manifest.shard_header(s as u32);
        file.set_len(header.file_len())
            .map_err(|e| Error::io(path, e))?;
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| Error::io(path, e))?;
        file.sync_all().map_err(|e| Error::io(path, e))?;
    }
    write_synced(&dir.join(SOURCES_FILE), sources.as_bytes())?;
    if !matches!(options.source, Source::Synthetic { .. }) {
        write_synced(&dir.join(HASHES_FILE), hashes_text(&hashes).as_bytes())?;
    }
    write_synced(&dir.join(MANIFEST_FILE), manifest.to_json().as_bytes())?;
    Ok(PackReport {
        manifest,
        warnings,
        holdout_duplicates: None,
    })
}

fn pack_item(
    layout: &RecordLayout,
    item: &SourceItem,
    index: u64,
    record: &mut [u8],
    image: &mut [u8],
    boxes: &mut Vec<RecordBox>,
) -> Result<Packed> {
    let bytes = fs::read(&item.image).map_err(|e| Error::io(&item.image, e))?;
    let decoded = letterbox::decode_image_bytes(&bytes, &item.image)?;
    let (w, h) = decoded.dimensions();
    let lb = letterbox::letterbox_into(&decoded, layout.width, image);
    let stats = letterbox::map_boxes(
        &item.boxes,
        item.units,
        w,
        h,
        &lb,
        layout.width,
        layout.max_boxes as usize,
        boxes,
    );
    let meta = RecordMeta {
        index,
        flags: 0,
        source_width: w,
        source_height: h,
        scale: lb.scale,
        pad_x: lb.pad_x,
        pad_y: lb.pad_y,
    };
    layout.encode(record, image, &meta, boxes);
    Ok(Packed {
        crc: layout.stored_checksum(record),
        stats,
        background: item.boxes.is_empty(),
        hash: Some(ImageHash::of(&bytes, &decoded)),
        sides: longer_sides(boxes),
    })
}

fn pack_synthetic(
    layout: &RecordLayout,
    seed: u64,
    index: u64,
    record: &mut [u8],
    image: &mut [u8],
    boxes: &mut Vec<RecordBox>,
) -> Packed {
    synthetic::render(seed, index, layout.width, image, boxes);
    boxes.truncate(layout.max_boxes as usize);
    let size = layout.width;
    let meta = RecordMeta {
        index,
        flags: 0,
        source_width: size,
        source_height: size,
        scale: 1.0,
        pad_x: 0.0,
        pad_y: 0.0,
    };
    layout.encode(record, image, &meta, boxes);
    let stats = BoxStats {
        kept: boxes.len(),
        ..BoxStats::default()
    };
    Packed {
        crc: layout.stored_checksum(record),
        stats,
        background: boxes.is_empty(),
        hash: None,
        sides: longer_sides(boxes),
    }
}

fn longer_sides(boxes: &[RecordBox]) -> Vec<f32> {
    boxes
        .iter()
        .map(|b| (b.x1 - b.x0).max(b.y1 - b.y0))
        .collect()
}

/// Moves the kept records down to dense indices, rewriting each one's index and checksum.
fn compact(
    layout: &RecordLayout,
    files: &[(PathBuf, File)],
    per_shard: u64,
    kept: &[(u64, u32)],
) -> Result<()> {
    let place = |i: u64| {
        (
            &files[(i / per_shard) as usize],
            HEADER_SIZE as u64 + (i % per_shard) * layout.record_size as u64,
        )
    };
    let mut record = vec![0u8; layout.record_size];
    for (new, &(old, _)) in kept.iter().enumerate() {
        let new = new as u64;
        if new == old {
            continue;
        }
        let ((src_path, src), src_off) = place(old);
        src.read_exact_at(&mut record, src_off)
            .map_err(|e| Error::io(src_path, e))?;
        let mut meta = layout.read_meta(&record);
        meta.index = new;
        let boxes: Vec<RecordBox> = (0..layout.box_count(&record) as usize)
            .map(|b| layout.read_box(&record, b))
            .collect();
        layout.write_meta(&mut record, &meta, &boxes);
        let ((dst_path, dst), dst_off) = place(new);
        dst.write_all_at(&record, dst_off)
            .map_err(|e| Error::io(dst_path, e))?;
    }
    Ok(())
}

/// A stable id for the dataset: a hash of its options and every record's checksum.
fn dataset_id(manifest: &Manifest, crcs: impl Iterator<Item = u32>) -> u64 {
    let mut h = crc32c::crc32c(manifest.classes.join("\n").as_bytes()) as u64;
    let shape = [
        manifest.width,
        manifest.height,
        manifest.max_boxes,
        manifest.records_per_shard,
    ];
    let mut lo = crc32c::crc32c(&shape.map(u32::to_le_bytes).concat());
    for crc in crcs {
        lo = crc32c::crc32c_append(lo, &crc.to_le_bytes());
    }
    h = (h << 32) | lo as u64;
    h
}

fn note_list(warnings: &mut Vec<String>, what: &str, items: impl ExactSizeIterator<Item = String>) {
    const SHOWN: usize = 5;
    let n = items.len();
    for item in items.take(SHOWN) {
        warnings.push(format!("{what}: {item}"));
    }
    if n > SHOWN {
        warnings.push(format!("… and {} more of: {what}", n - SHOWN));
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(path, e))
}

/// Moves the finished dataset into place; an old one (with `--force`) is removed only after.
fn publish(tmp: &Path, out: &Path) -> Result<()> {
    let sync_parent = |p: &Path| {
        if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
    };
    if out.exists() {
        let mut old = out.file_name().unwrap_or_default().to_owned();
        old.push(".fulcrum-old");
        let old = out.with_file_name(old);
        let _ = fs::remove_dir_all(&old);
        fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
        fs::rename(tmp, out).map_err(|e| Error::io(out, e))?;
        sync_parent(out);
        fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
    } else {
        fs::rename(tmp, out).map_err(|e| Error::io(out, e))?;
        sync_parent(out);
    }
    Ok(())
}
