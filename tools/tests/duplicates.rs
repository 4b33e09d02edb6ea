//! Splits that do not leak: `pack --holdout` keeps a picture and its copies (the same file, a
//! re-encoded one, a resized one) on one side, `inspect` lists the copies inside a pack, and
//! `eval` warns when held-out images duplicate the images the checkpoint was trained on.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod common;

use common::{assert_mentions, fulcrum};

/// A YOLO folder (images/ + labels/) of 14 coco128 photos `p0` … `p13` and three copies: `p0`
/// byte for byte, `p1` re-encoded at JPEG quality 60 and `p2` resized to 90 %.
fn photos_with_copies(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("images")).unwrap();
    std::fs::create_dir_all(dir.join("labels")).unwrap();
    let jpgs = common::coco128_photos();
    let label = |name: &str| {
        std::fs::write(
            dir.join(format!("labels/{name}.txt")),
            "0 0.4 0.4 0.3 0.3\n",
        )
        .unwrap()
    };
    for (i, jpg) in jpgs.iter().take(14).enumerate() {
        std::fs::copy(jpg, dir.join(format!("images/p{i}.jpg"))).unwrap();
        label(&format!("p{i}"));
    }
    std::fs::copy(jpgs[0].clone(), dir.join("images/z-copy-of-p0.jpg")).unwrap();
    label("z-copy-of-p0");
    let p1 = image::open(&jpgs[1]).unwrap().to_rgb8();
    let mut q60 = std::fs::File::create(dir.join("images/z-p1-q60.jpg")).unwrap();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut q60, 60)
        .encode_image(&p1)
        .unwrap();
    label("z-p1-q60");
    let p2 = image::open(&jpgs[2]).unwrap().to_rgb8();
    let (w, h) = p2.dimensions();
    image::imageops::resize(
        &p2,
        w * 9 / 10,
        h * 9 / 10,
        image::imageops::FilterType::Triangle,
    )
    .save(dir.join("images/z-p2-small.jpg"))
    .unwrap();
    label("z-p2-small");
    std::fs::write(dir.join("classes.txt"), "thing\n").unwrap();
    dir.to_owned()
}

/// The file names a pack's records came from.
fn sources(pack: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(pack.join("sources.txt"))
        .unwrap()
        .lines()
        .map(|l| {
            Path::new(l)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[test]
fn holdout_keeps_copies_together_and_inspect_and_eval_name_them() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    photos_with_copies(&cwd.join("src"));
    let groups = [
        ["p0.jpg", "z-copy-of-p0.jpg"],
        ["p1.jpg", "z-p1-q60.jpg"],
        ["p2.jpg", "z-p2-small.jpg"],
    ];
    let mut split_groups = 0;
    for seed in 0..6 {
        let seed = seed.to_string();
        let args = [
            "pack",
            "src",
            "--out",
            "train",
            "--holdout",
            "0.4",
            "--holdout-out",
            "val",
            "--holdout-seed",
            &seed,
            "--force",
        ];
        let run = fulcrum(cwd, &args);
        run.expect(0);
        assert_mentions(
            &run.stdout,
            &[
                "hold-out split: 3 groups of duplicate pictures",
                "(6 images: 1 pairs byte-identical, 2",
            ],
        );
        let (train, val) = (sources(&cwd.join("train")), sources(&cwd.join("val")));
        assert_eq!(train.len() + val.len(), 17, "seed {seed}");
        assert!(train.is_disjoint(&val));
        for group in &groups {
            let in_train = group.iter().filter(|n| train.contains(**n)).count();
            assert!(
                in_train == 0 || in_train == group.len(),
                "seed {seed}: {group:?} split across train {train:?} and val {val:?}"
            );
            split_groups += usize::from(in_train == 0);
        }
    }
    // The seeds put groups on both sides: the test saw the held-out side too.
    assert!(split_groups > 0 && split_groups < 18, "{split_groups}");

    // Inside a pack that holds them all, inspect names each group.
    fulcrum(cwd, &["pack", "src", "--out", "all"]).expect(0);
    let run = fulcrum(cwd, &["inspect", "all"]);
    run.expect(0);
    assert_mentions(
        &run.stdout,
        &[
            "duplicates: 3 groups, 6 records (1 pairs byte-identical, 2 the same picture saved again)",
            "p0.jpg = ",
            "z-copy-of-p0.jpg",
            "p1.jpg = ",
            "z-p1-q60.jpg",
            "z-p2-small.jpg",
        ],
    );
    let run = fulcrum(cwd, &["inspect", "all", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["duplicates"].as_array().unwrap().len(), 3, "{doc}");
    assert_eq!(doc["manifest"]["summary"]["duplicate_groups"], 3);
    let run = fulcrum(cwd, &["inspect", "val"]);
    assert_mentions(&run.stdout, &["duplicates:"]);

    // A checkpoint trained on the training side, evaluated on its own held-out side and on
    // everything: only the second holds duplicates of what it was trained on.
    let train = [
        "train",
        "--data",
        "train",
        "--out",
        "run",
        "--epochs",
        "1",
        "--max-steps",
        "2",
        "--batch",
        "4",
        "--engine",
        "cpu",
        "--threads",
        "1",
    ];
    fulcrum(cwd, &train).expect(0);
    let eval = |data: &str| {
        let json = format!("{data}.json");
        let run = fulcrum(
            cwd,
            &[
                "eval",
                "--weights",
                "run/last.safetensors",
                "--data",
                data,
                "--engine",
                "cpu",
                "--threads",
                "1",
                "--json",
                &json,
            ],
        );
        run.expect(0);
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cwd.join(json)).unwrap()).unwrap();
        (run.stderr.clone(), doc["duplicates_of_training"].clone())
    };
    let (stderr, count) = eval("val");
    assert_eq!(count, 0, "{stderr}");
    assert!(
        !stderr.contains("duplicate images the checkpoint"),
        "{stderr}"
    );
    let (stderr, count) = eval("all");
    let trained = sources(&cwd.join("train")).len() as u64;
    assert!(count.as_u64().unwrap() >= trained, "{count} {stderr}");
    assert_mentions(
        &stderr,
        &[
            "held-out images duplicate images the checkpoint was trained on",
            "the same file",
        ],
    );
}
