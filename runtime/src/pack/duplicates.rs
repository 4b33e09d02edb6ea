//! Duplicate photos: the same file twice (exact: the same bytes), or the same picture saved
//! again (near: re-encoded, resized, recompressed, a consecutive video frame). A split that
//! puts one copy in training and the other in the held-out set scores memory, not detection,
//! so `pack --holdout` keeps every group of duplicates on one side, `inspect` lists the groups
//! inside a pack, and `eval` warns when held-out images duplicate training images.
//!
//! Near duplicates are found by a *difference hash* (dHash): the picture's luma averaged over
//! a 9 × 8 grid of areas, one bit per horizontally adjacent pair (is the right one brighter?).
//! Scale, compression and small colour changes leave most of the 64 bits alone; two pictures
//! are near duplicates when their hashes differ in at most [`NEAR_BITS`] bits. Every pack of
//! a real dataset writes each record's hashes to [`HASHES_FILE`] beside its manifest.

use std::path::Path;

use image::RgbImage;

/// Most differing bits of two difference hashes that still make near duplicates. Measured on
/// `../shared/data`: re-encoding a photo at JPEG quality 60 or resizing it by 10 % moves 0–3
/// bits, and the raccoon set's resized copies are 1–2 bits from their originals (5 for one
/// with a caption added); distinct photos are 10 or more apart (10: two shots of the same
/// raccoon a moment apart; the next pair 15), coco128's at least 12, unrelated pictures about
/// 32.
pub const NEAR_BITS: u32 = 8;

/// The file beside a pack's manifest with each record's hashes, a line a record:
/// `CONTENT DHASH` in hex (`-` for a picture that could not be hashed).
pub const HASHES_FILE: &str = "hashes.txt";

/// A picture's hashes: of its file's bytes and of what it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHash {
    /// Of the file's bytes (two CRC-32Cs): equal for byte-identical files.
    pub content: u64,
    /// The difference hash of the decoded picture.
    pub dhash: u64,
}

impl ImageHash {
    /// The hashes of a decoded picture and the bytes of the file it came from.
    pub fn of(bytes: &[u8], picture: &RgbImage) -> Self {
        ImageHash {
            content: content_hash(bytes),
            dhash: dhash(picture),
        }
    }

    /// Whether `self` and `other` are the same picture: the same bytes, or hashes within
    /// [`NEAR_BITS`].
    pub fn duplicates(&self, other: &ImageHash) -> Option<Kind> {
        if self.content == other.content {
            Some(Kind::Exact)
        } else if (self.dhash ^ other.dhash).count_ones() <= NEAR_BITS {
            Some(Kind::Near)
        } else {
            None
        }
    }

    fn line(&self) -> String {
        format!("{:016x} {:016x}", self.content, self.dhash)
    }

    fn parse(line: &str) -> Option<Self> {
        let (content, dhash) = line.trim().split_once(' ')?;
        Some(ImageHash {
            content: u64::from_str_radix(content, 16).ok()?,
            dhash: u64::from_str_radix(dhash, 16).ok()?,
        })
    }
}

/// How two pictures duplicate each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exact,
    Near,
}

/// A 64-bit hash of a file's bytes: CRC-32C under two seeds.
pub fn content_hash(bytes: &[u8]) -> u64 {
    let a = crc32c::crc32c(bytes);
    let b = crc32c::crc32c_append(0x9E37_79B9, bytes);
    (u64::from(a) << 32) | u64::from(b)
}

/// The difference hash of `picture` (see the module docs): bit `8·y + x` is set where the area
/// `(x + 1, y)` of the 9 × 8 grid is brighter than the area `(x, y)`.
pub fn dhash(picture: &RgbImage) -> u64 {
    const W: usize = 9;
    const H: usize = 8;
    let (w, h) = (picture.width() as usize, picture.height() as usize);
    if w == 0 || h == 0 {
        return 0;
    }
    let mut sums = [[0.0f64; W]; H];
    let mut counts = [[0u32; W]; H];
    let raw = picture.as_raw();
    for y in 0..h {
        let gy = y * H / h;
        let row = &raw[y * w * 3..(y + 1) * w * 3];
        for (x, px) in row.chunks_exact(3).enumerate() {
            let gx = x * W / w;
            let luma =
                0.299 * f64::from(px[0]) + 0.587 * f64::from(px[1]) + 0.114 * f64::from(px[2]);
            sums[gy][gx] += luma;
            counts[gy][gx] += 1;
        }
    }
    let mut hash = 0u64;
    for y in 0..H {
        let mean = |x: usize| sums[y][x] / f64::from(counts[y][x].max(1));
        for x in 0..W - 1 {
            if mean(x + 1) > mean(x) {
                hash |= 1 << (8 * y + x);
            }
        }
    }
    hash
}

/// Groups of duplicates among pictures: each group lists indices into the hashes it was found
/// in, smallest first, and has at least two members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups {
    pub groups: Vec<Vec<usize>>,
    /// Pairs found byte-identical, and near (of those that were not).
    pub exact_pairs: usize,
    pub near_pairs: usize,
}

impl Groups {
    /// The groups among `hashes` (`None`: a picture that could not be hashed, in no group):
    /// duplicates of duplicates join one group. Compares every pair: about a second for 50 000
    /// pictures.
    pub fn find(hashes: &[Option<ImageHash>]) -> Groups {
        let n = hashes.len();
        let mut parent: Vec<usize> = (0..n).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        let (mut exact_pairs, mut near_pairs) = (0, 0);
        for i in 0..n {
            let Some(a) = &hashes[i] else { continue };
            for (j, b) in hashes.iter().enumerate().skip(i + 1) {
                let Some(kind) = b.as_ref().and_then(|b| a.duplicates(b)) else {
                    continue;
                };
                match kind {
                    Kind::Exact => exact_pairs += 1,
                    Kind::Near => near_pairs += 1,
                }
                let (ri, rj) = (root(&mut parent, i), root(&mut parent, j));
                parent[ri.max(rj)] = ri.min(rj);
            }
        }
        let mut by_root: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for i in 0..n {
            let r = root(&mut parent, i);
            by_root.entry(r).or_default().push(i);
        }
        Groups {
            groups: by_root.into_values().filter(|g| g.len() > 1).collect(),
            exact_pairs,
            near_pairs,
        }
    }

    /// Pictures in some group.
    pub fn images(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }
}

/// Pairs `(i, j, kind)` where picture `i` of `a` duplicates picture `j` of `b`.
pub fn across(a: &[Option<ImageHash>], b: &[Option<ImageHash>]) -> Vec<(usize, usize, Kind)> {
    let mut found = Vec::new();
    for (i, x) in a.iter().enumerate() {
        let Some(x) = x else { continue };
        for (j, y) in b.iter().enumerate() {
            if let Some(kind) = y.as_ref().and_then(|y| x.duplicates(y)) {
                found.push((i, j, kind));
            }
        }
    }
    found
}

/// The text of [`HASHES_FILE`] for `hashes`, one line each.
pub fn hashes_text(hashes: &[Option<ImageHash>]) -> String {
    let mut text = String::with_capacity(hashes.len() * 34);
    for h in hashes {
        match h {
            Some(h) => text.push_str(&h.line()),
            None => text.push('-'),
        }
        text.push('\n');
    }
    text
}

/// Each record's hashes from a pack's [`HASHES_FILE`]; `None` where the pack has none (packs
/// made before it, synthetic ones) or it does not hold one line per record.
pub fn read_hashes(dir: &Path, records: u64) -> Option<Vec<Option<ImageHash>>> {
    let text = std::fs::read_to_string(dir.join(HASHES_FILE)).ok()?;
    let hashes: Vec<Option<ImageHash>> = text.lines().map(ImageHash::parse).collect();
    (hashes.len() as u64 == records).then_some(hashes)
}

/// Each record's source (`sources.txt` of the pack in `dir`; empty where it has none).
fn source_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join(crate::format::SOURCES_FILE))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Record `i`'s name among `names`, or its index where the names do not reach it.
fn record_name(names: &[String], i: usize) -> String {
    names.get(i).cloned().unwrap_or(format!("record {i}"))
}

/// The groups of duplicates inside the pack in `dir` of `records` records, each named by its
/// records' source files (`sources.txt`), or by record index where those are missing. `None`
/// where the pack has no hashes (synthetic, or packed before pictures were hashed).
pub fn in_pack(dir: &Path, records: u64) -> Option<(Groups, Vec<Vec<String>>)> {
    let hashes = read_hashes(dir, records)?;
    let sources = source_lines(dir);
    let groups = Groups::find(&hashes);
    let named = groups
        .groups
        .iter()
        .map(|g| g.iter().map(|&i| record_name(&sources, i)).collect())
        .collect();
    Some((groups, named))
}

/// Held-out pictures that duplicate training pictures: what [`leaks`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leaks {
    /// Pairs (held-out source, training source, kind), each held-out picture once.
    Found(Vec<(String, String, Kind)>),
    /// One of the packs has no hashes (synthetic, or packed before pictures were hashed).
    Unknown,
}

/// The held-out pictures of the pack in `held_out` (of `held_out_records` records) that
/// duplicate pictures of the training pack in `training`; `Err` where the training pack
/// cannot be opened (moved, or named relative to another folder).
pub fn leaks(
    training: &Path,
    held_out: &Path,
    held_out_records: u64,
) -> Result<Leaks, crate::format::Error> {
    let manifest = crate::format::Manifest::load(training)?;
    let (Some(train), Some(val)) = (
        read_hashes(training, manifest.records),
        read_hashes(held_out, held_out_records),
    ) else {
        return Ok(Leaks::Unknown);
    };
    let names = |dir: &Path| -> Vec<String> {
        source_lines(dir)
            .iter()
            .map(|l| {
                Path::new(l)
                    .file_name()
                    .map_or(l.to_owned(), |n| n.to_string_lossy().into_owned())
            })
            .collect()
    };
    let (train_names, val_names) = (names(training), names(held_out));
    let mut seen = std::collections::BTreeSet::new();
    let pairs = across(&val, &train)
        .into_iter()
        .filter(|&(v, _, _)| seen.insert(v))
        .map(|(v, t, kind)| {
            (
                record_name(&val_names, v),
                record_name(&train_names, t),
                kind,
            )
        })
        .collect();
    Ok(Leaks::Found(pairs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::imageops::FilterType;

    fn photo(name: &str) -> (Vec<u8>, RgbImage) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/raccoon/images")
            .join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let picture = image::load_from_memory(&bytes).unwrap().to_rgb8();
        (bytes, picture)
    }

    fn jpeg(picture: &RgbImage, quality: u8) -> Vec<u8> {
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
            .encode_image(picture)
            .unwrap();
        out
    }

    #[test]
    fn copies_resaved_or_resized_are_near_and_other_photos_are_not() {
        let (bytes, original) = photo("raccoon-1.jpg");
        let base = ImageHash::of(&bytes, &original);
        let (w, h) = original.dimensions();
        let resized =
            image::imageops::resize(&original, w * 9 / 10, h * 9 / 10, FilterType::Triangle);
        let reencoded_bytes = jpeg(&original, 60);
        let reencoded = image::load_from_memory(&reencoded_bytes).unwrap().to_rgb8();
        for (what, bytes, picture) in [
            (
                "re-encoded at quality 60",
                reencoded_bytes.clone(),
                reencoded,
            ),
            ("resized by 0.9", jpeg(&resized, 90), resized),
        ] {
            let copy = ImageHash::of(&bytes, &picture);
            assert_ne!(copy.content, base.content, "{what}");
            assert_eq!(
                copy.duplicates(&base),
                Some(Kind::Near),
                "{what}: {copy:x?} {base:x?}"
            );
        }
        assert_eq!(
            ImageHash::of(&bytes, &original).duplicates(&base),
            Some(Kind::Exact)
        );
        // Every other raccoon photo (distinct files of similar scenes) is farther.
        let (mut nearest, mut nearest_name) = (64, String::new());
        for k in 2..=40 {
            let name = format!("raccoon-{k}.jpg");
            let (b, p) = photo(&name);
            let other = ImageHash::of(&b, &p);
            let d = (other.dhash ^ base.dhash).count_ones();
            if d < nearest {
                (nearest, nearest_name) = (d, name);
            }
        }
        assert!(
            nearest > NEAR_BITS,
            "{nearest_name} is {nearest} bits from raccoon-1"
        );
    }

    #[test]
    fn duplicates_of_duplicates_form_one_group() {
        let h = |content, dhash| Some(ImageHash { content, dhash });
        let hashes = [
            h(1, 0),
            h(2, 0xFFFF_0000_0000_0000),
            h(3, 0b111),                 // 3 bits from the first: near
            h(1, 0xFFFF_FFFF_FFFF_FFFF), // the first's bytes: exact
            None,
            h(4, 0xFFFF_0000_0000_0001), // near the second
        ];
        let g = Groups::find(&hashes);
        assert_eq!(g.groups, vec![vec![0, 2, 3], vec![1, 5]]);
        assert_eq!((g.exact_pairs, g.near_pairs), (1, 2));
        assert_eq!(g.images(), 5);
        let text = hashes_text(&hashes);
        let parsed: Vec<Option<ImageHash>> = text.lines().map(ImageHash::parse).collect();
        assert_eq!(parsed, hashes);
        assert_eq!(
            across(&hashes[..2], &hashes[3..]),
            vec![(0, 0, Kind::Exact), (1, 2, Kind::Near)]
        );
    }
}
