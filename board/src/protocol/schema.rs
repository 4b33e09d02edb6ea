//! The protocol's schema: every message layout as text, and its hash. Client and daemon
//! exchange [`SCHEMA_HASH`] in `Hello`/`Welcome`, so two builds whose layouts differ refuse
//! each other at connect instead of misreading each other mid-stream. A test checks each
//! line's size against the encoder's, so a layout change that is not written here fails.

/// One line a layout: the part, its wire kind (0: not a message), then `field:type` in wire
/// order; `_` fields are reserved (written 0, ignored). `+` marks what follows the fixed part.
pub const SCHEMA: &str = "\
header 0 magic:u32 version:u16 kind:u16 sequence:u32 body_len:u32 timestamp_us:u64
hello 1 schema_hash:u32 _:u32
welcome 2 schema_hash:u32 input_width:u16 input_height:u16 classes:u16 max_frame_side:u16 max_inline_bytes:u32 max_detections:u16 engine:u8 _:u8 weights_generation:u32
infer 3 format:u8 source:u8 width:u16 height:u16 max_detections:u16 stride:u32 length:u32 offset:u64 min_score:f32 colour:u8 _:u8 _:u16 crop_x:u16 crop_y:u16 crop_width:u16 crop_height:u16 +pixels
attach_ring 4 len:u64
detections 5 count:u16 frame_width:u16 frame_height:u16 _:u16 engine_us:u32 total_us:u32 weights_generation:u32 min_score:f32 nms_iou:f32 +detection*count
stats_request 6
stats 7 requests:u64 errors:u64 refused:u32 clients:u16 _:u16 p50_us:u32 p99_us:u32 p999_us:u32 forward_us:u32 uptime_s:u32 weights_generation:u32
health_request 8
health 9 state:u8 engine:u8 _:u16 uptime_s:u32 weights_generation:u32 since_progress_ms:u32
reload 10 path_len:u16 _:u16 +path
fine_tune_start 11 max_steps:u32 epochs:u16 path_len:u16 flags:u32 +path
fine_tune_stop 12
fine_tune_status_request 13
fine_tune_status 14 state:u8 _:u8 epoch:u16 step:u32 total_steps:u32 loss:f32 serving_map:f32 candidate_map:f32 swaps:u32 load_per_batch_us:u32 step_us:u32
ack 15 kind:u16 _:u16
error 16 code:u16 text_len:u16 +text
classes_request 17
classes 18 count:u16 text_len:u16 +names
detection 0 class:u16 _:u16 score:f32 x0:f32 y0:f32 x1:f32 y1:f32
";

/// 32-bit FNV-1a of [`SCHEMA`].
pub const SCHEMA_HASH: u32 = fnv1a(SCHEMA.as_bytes());

const fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u32;
        hash = hash.wrapping_mul(0x0100_0193);
        i += 1;
    }
    hash
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::protocol::*;
    use std::collections::BTreeMap;

    /// (kind, fixed bytes) of each line of the schema.
    fn schema_sizes() -> BTreeMap<&'static str, (u16, usize)> {
        SCHEMA
            .lines()
            .map(|line| {
                let mut words = line.split(' ');
                let name = words.next().unwrap();
                let kind = words.next().unwrap().parse().unwrap();
                let size = words
                    .filter(|w| !w.starts_with('+'))
                    .map(|w| match w.split(':').nth(1).unwrap() {
                        "u8" => 1,
                        "u16" => 2,
                        "u32" | "f32" => 4,
                        "u64" => 8,
                        t => panic!("unknown type {t} in {line}"),
                    })
                    .sum();
                (name, (kind, size))
            })
            .collect()
    }

    #[test]
    fn schema_matches_the_encoders() {
        let sizes = schema_sizes();
        let expect = [
            ("header", 0, HEADER_LEN),
            ("hello", Kind::Hello as u16, Hello::LEN),
            ("welcome", Kind::Welcome as u16, Welcome::LEN),
            ("infer", Kind::Infer as u16, FrameDesc::LEN),
            ("attach_ring", Kind::AttachRing as u16, AttachRing::LEN),
            (
                "detections",
                Kind::Detections as u16,
                DetectionsReply::FIXED_LEN,
            ),
            ("stats_request", Kind::StatsRequest as u16, 0),
            ("stats", Kind::Stats as u16, Stats::LEN),
            ("health_request", Kind::HealthRequest as u16, 0),
            ("health", Kind::Health as u16, Health::LEN),
            ("reload", Kind::Reload as u16, RELOAD_FIXED_LEN),
            (
                "fine_tune_start",
                Kind::FineTuneStart as u16,
                FineTuneParams::LEN,
            ),
            ("fine_tune_stop", Kind::FineTuneStop as u16, 0),
            (
                "fine_tune_status_request",
                Kind::FineTuneStatusRequest as u16,
                0,
            ),
            (
                "fine_tune_status",
                Kind::FineTuneStatus as u16,
                FineTuneStatus::LEN,
            ),
            ("ack", Kind::Ack as u16, ACK_LEN),
            ("error", Kind::Error as u16, ERROR_FIXED_LEN),
            ("classes_request", Kind::ClassesRequest as u16, 0),
            ("classes", Kind::Classes as u16, CLASSES_FIXED_LEN),
            ("detection", 0, Detection::LEN),
        ];
        assert_eq!(
            sizes.len(),
            expect.len(),
            "a schema line without a check, or the reverse"
        );
        for (name, kind, len) in expect {
            assert_eq!(sizes.get(name), Some(&(kind, len)), "schema line `{name}`");
        }
        // Every kind is in the schema once.
        for kind in Kind::ALL {
            assert_eq!(sizes.values().filter(|(k, _)| *k == kind as u16).count(), 1);
        }
    }

    #[test]
    fn hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_ne!(SCHEMA_HASH, fnv1a(SCHEMA.replace("u16", "u32").as_bytes()));
    }
}
