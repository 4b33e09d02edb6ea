//! Byte-level entry points to every parser of outside input, for the fuzz targets in
//! `runtime/fuzz` (and anyone who wants to feed a parser without files). Each runs the parser
//! the CLI runs and discards the result: errors are the expected outcome of most inputs; a
//! panic, a hang or an allocation out of proportion to the input is a bug.

use std::path::Path;

use crate::format::{Manifest, RecordLayout, ShardHeader};

const NAME: &str = "fuzz-input";

/// A shard's header.
pub fn shard_header(bytes: &[u8]) {
    let _ = ShardHeader::decode(bytes, Path::new(NAME));
}

/// A record, checked as the loaders check it, under a layout taken from the first bytes.
pub fn record(bytes: &[u8]) {
    let [w, h, boxes, classes, rest @ ..] = bytes else {
        return;
    };
    // The small layouts `pack --size 32/64` writes, so that real records are valid seeds.
    let side = |b: u8| 32 * (1 + u32::from(b % 2));
    let (w, h, boxes) = (side(*w), side(*h), u32::from(*boxes % 64));
    let Ok(layout) = RecordLayout::new(w, h, 3, boxes) else {
        return;
    };
    if rest.len() >= layout.record_size {
        let record = &rest[..layout.record_size];
        let _ = layout.verify(record, 0, u32::from(*classes));
        let _ = layout.check_boxes(record, u32::from(*classes));
    }
}

/// A dataset's `manifest.json`.
pub fn manifest(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = Manifest::parse(text, Path::new(NAME));
    }
}

/// A YOLO label file, with and without a known class count.
pub fn yolo_labels(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let (mut boxes, mut rejected) = (Vec::new(), Vec::new());
        crate::pack::yolo::parse_labels(text, Path::new(NAME), None, &mut boxes, &mut rejected);
        crate::pack::yolo::parse_labels(text, Path::new(NAME), Some(3), &mut boxes, &mut rejected);
    }
}

/// An Ultralytics `data.yaml`: the YAML and its class names.
pub fn data_yaml(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(doc) = crate::pack::yolo::parse_yaml(text) {
            let _ = crate::pack::yolo::parse_names(&doc["names"]);
        }
    }
}

/// A Pascal VOC annotation.
pub fn voc_annotation(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let mut rejected = Vec::new();
        let _ = crate::pack::voc::parse_annotation(text, Path::new(NAME), &mut rejected);
    }
}

/// A COCO annotations file (images looked for in a folder that does not exist).
pub fn coco_json(bytes: &[u8]) {
    let dir = Path::new("/nonexistent-fuzz-images");
    let _ = crate::pack::coco::import_bytes(bytes, Path::new(NAME), Some(dir));
}

/// A checkpoint (safetensors with fulcrum's metadata).
pub fn checkpoint(bytes: &[u8]) {
    let _ = crate::model::Checkpoint::decode(Path::new(NAME), bytes);
}

/// Size limit of [`image`], in pixels: decoders accept truncated data (zune-jpeg fills missing
/// blocks), so a 200-byte JPEG can declare, and cost the decoding of, 100 megapixels, and time
/// goes into decoding blocks, not into the parsing the campaign is for. Past a few blocks a
/// larger image only runs the same loops longer, so the target caps at 256 × 256 px, as image
/// fuzzers usually do (libpng's OSS-Fuzz harness caps at 2048 × 2048), and a campaign reaches
/// millions of executions; the check itself is the one every decode runs.
pub const IMAGE_FUZZ_PIXELS: u64 = 256 * 256;

/// An image, through the decoder's size check (at [`IMAGE_FUZZ_PIXELS`]).
pub fn image(bytes: &[u8]) {
    let _ = crate::pack::letterbox::decode_image_bytes_within(
        bytes,
        Path::new(NAME),
        IMAGE_FUZZ_PIXELS,
    );
}

/// fulcrumd's configuration file, parsed and checked into a serving configuration as the
/// daemon does at start ([`crate::serve::settings`]).
pub fn daemon_config(bytes: &[u8]) {
    use crate::serve::settings::{Defaults, Settings};
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(settings) = Settings::from_toml(text) else {
        return;
    };
    let _ = settings.into_config(Defaults {
        socket: NAME.into(),
        state_dir: None,
        threads: 2,
    });
}

/// A request to the daemon, with a ring attached: the first two bytes give the ring's length
/// (up to 64 KiB, filled with a pattern), the rest is a message. An `Infer` goes through the
/// daemon's own checks ([`crate::serve::frame::resolve`], at its default frame-side limit), and
/// a frame that passes goes through the frame pass, its crop and colour space included, into a
/// small letterbox.
pub fn frame_request(bytes: &[u8]) {
    use crate::serve::server::DEFAULT_MAX_FRAME_SIDE;
    use fulcrum_board::protocol::{decode, Message};
    let Some((len, message)) = bytes.split_first_chunk::<2>() else {
        return;
    };
    let ring: Vec<u8> = (0..usize::from(u16::from_le_bytes(*len)))
        .map(|i| (i * 31) as u8)
        .collect();
    let Ok((_, Message::Infer(frame))) = decode(message) else {
        return;
    };
    let Ok(view) = crate::serve::frame::resolve(
        frame.desc,
        frame.pixels,
        Some(&ring),
        DEFAULT_MAX_FRAME_SIDE,
    ) else {
        return;
    };
    let mut out = vec![0u8; 16 * 16 * 3];
    crate::pixels::FramePass::new(16)
        .run(&view.pixels(), view.crop(), &mut out)
        .expect("a frame the daemon accepts is one the frame pass reads");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry survives empty, tiny and garbage input (the fuzz targets do the rest).
    #[test]
    fn entries_take_any_bytes() {
        let inputs: [&[u8]; 5] = [
            b"",
            b"\0",
            b"{}",
            b"\xff\xfe garbage \x00\x01",
            &[7u8; 5000],
        ];
        for bytes in inputs {
            shard_header(bytes);
            record(bytes);
            manifest(bytes);
            yolo_labels(bytes);
            data_yaml(bytes);
            voc_annotation(bytes);
            coco_json(bytes);
            checkpoint(bytes);
            image(bytes);
            frame_request(bytes);
            daemon_config(bytes);
        }
    }

    /// The `frame_request` seeds: an inline and a ring frame that pass the checks (so the
    /// campaign starts from the pixels), and one outside its ring. `FULCRUM_BLESS=1` writes
    /// them to `runtime/fuzz/seeds/frame_request`; otherwise they must match what is there.
    #[test]
    fn frame_request_seeds_are_current_and_reach_the_pixels() {
        use crate::serve::server::DEFAULT_MAX_FRAME_SIDE;
        use fulcrum_board::protocol::{
            ColourSpace, Crop, Frame, FrameDesc, FrameSource, Message, PixelFormat, HEADER_LEN,
        };
        let seed = |ring_len: u16, desc: FrameDesc, pixels: &[u8]| {
            let msg = Message::Infer(Frame { desc, pixels });
            let mut bytes = ring_len.to_le_bytes().to_vec();
            let start = bytes.len();
            bytes.resize(start + msg.encoded_len(), 0);
            msg.encode(1, 0, &mut bytes[start..]).unwrap();
            bytes
        };
        let patched = |mut bytes: Vec<u8>, at: usize, with: &[u8]| {
            bytes[at..at + with.len()].copy_from_slice(with);
            bytes
        };
        let rgb = FrameDesc::packed(PixelFormat::Rgb8, FrameSource::Inline, 8, 6).unwrap();
        let nv12 = FrameDesc::packed(PixelFormat::Nv12, FrameSource::Ring, 16, 8).unwrap();
        let outside = FrameDesc { offset: 60, ..nv12 };
        let cropped = FrameDesc {
            colour: ColourSpace::Bt709Full,
            crop: Crop {
                x: 3,
                y: 1,
                width: 9,
                height: 5,
            },
            ..nv12
        };
        let yuyv = FrameDesc::packed(PixelFormat::Yuyv, FrameSource::Inline, 6, 4).unwrap();
        let bgra = FrameDesc::packed(PixelFormat::Bgra8, FrameSource::Inline, 5, 3).unwrap();
        let seeds = [
            ("inline-rgb.bin", seed(0, rgb, &[9; 144]), true),
            ("ring-nv12.bin", seed(256, nv12, &[]), true),
            ("outside-ring.bin", seed(64, outside, &[]), false),
            ("cropped-nv12.bin", seed(256, cropped, &[]), true),
            ("inline-yuyv.bin", seed(0, yuyv, &[77; 48]), true),
            ("inline-bgra.bin", seed(0, bgra, &[200; 60]), true),
            // The rejections: a crop reaching outside the frame, an odd NV12 height, a stride
            // shorter than a row (descriptions the encoder refuses, so written by hand).
            (
                "bad-crop.bin",
                patched(seed(256, nv12, &[]), 2 + HEADER_LEN + 32, &[15, 0]),
                false,
            ),
            (
                "odd-nv12.bin",
                patched(seed(256, nv12, &[]), 2 + HEADER_LEN + 4, &[7, 0]),
                false,
            ),
            (
                "short-stride.bin",
                patched(seed(0, rgb, &[9; 144]), 2 + HEADER_LEN + 8, &[5]),
                false,
            ),
        ];
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/frame_request");
        for (name, bytes, passes) in &seeds {
            let ring = vec![0u8; usize::from(u16::from_le_bytes([bytes[0], bytes[1]]))];
            let passed = match fulcrum_board::protocol::decode(&bytes[2..]) {
                Ok((_, Message::Infer(frame))) => crate::serve::frame::resolve(
                    frame.desc,
                    frame.pixels,
                    Some(&ring),
                    DEFAULT_MAX_FRAME_SIDE,
                )
                .is_ok(),
                Ok((_, other)) => panic!("{name}: {other:?}"),
                Err(_) => false,
            };
            assert_eq!(passed, *passes, "{name}");
            frame_request(bytes);
            if std::env::var_os("FULCRUM_BLESS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(name), bytes).unwrap();
            }
            assert_eq!(
                &std::fs::read(dir.join(name)).unwrap(),
                bytes,
                "{name} is stale: rewrite with FULCRUM_BLESS=1"
            );
        }
    }
}
