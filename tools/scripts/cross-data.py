#!/usr/bin/env python3
"""A training recipe measured across data of several kinds, not on one split.

Runs `fulcrum train` with one or more recipe variants over the sets below, at several training
seeds each, scores every run with `fulcrum eval` on its held-out images, and prints mean and
spread (sample standard deviation over runs) of mAP@0.5, mAP@[.5:.95], AP@0.5 per COCO object
size (by area on the source photo) and the training time:

  raccoon-h0/h1/h2  ../shared/data/raccoon at 256, hold-out seeds 0, 1, 2 (20 %, duplicates kept
                    on one side): large objects that fill the photo.
  coco128           ../shared/data/coco128 at 256, all 80 classes, hold-out seed 0 (20 %):
                    the small-objects set: 60 % of its boxes are under 32² px at 256.
  coco128-person    the same photos, persons alone (the other labels dropped; 59 % small).
  synthetic         the built-in set at 256 (1024 training images, 256 held out of another
                    seed): discs and squares from 16 px to half the image, most of them small.

(A set of only the coco128 photos whose boxes are mostly small, 50 photos of 80 classes, taught
nothing in 1200 steps: mAP@0.5 0.000. Too few photos per class to compare recipes on.)

A developer tool, not a test: each run takes minutes (the recipe's 1200 steps of det-m@256).
Results go to OUT/results.jsonl as they come; a run already there is not run again, so an
interrupted sweep continues where it stopped. Measure on a quiet machine.

    cargo build --release
    python3 tools/scripts/cross-data.py --out runs/cross-data --seeds 0 1 \\
        --variant today="" --variant cap8="--neighbour-cells 8"
    python3 tools/scripts/cross-data.py --out runs/cross-data --report   # the table again

A variant is NAME="extra train arguments" added after `--recipe photos`; without any, the
recipe as it is ("recipe"), which starts det-m from the built-in base: `--variant
scratch="--from-scratch"` measures the random start beside it (the base was trained on the
same generator as the synthetic set, other seeds: its figures there flatter the base).
`--sets` picks sets by name.
"""

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
SIZE = 256
SETS = [
    "raccoon-h0",
    "raccoon-h1",
    "raccoon-h2",
    "coco128",
    "coco128-person",
    "synthetic",
]


def run(cmd, log=None):
    """Runs `cmd`, its output to `log` (or inherited); fails loudly with the log's tail."""
    out = open(log, "w") if log else None
    try:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()
    if p.returncode != 0:
        tail = Path(log).read_text()[-2000:] if log else ""
        sys.exit(f"failed ({p.returncode}): {shlex.join(map(str, cmd))}\n{tail}")


def jpeg_size(path):
    """(width, height) of a baseline or progressive JPEG, from its SOF marker."""
    d = path.read_bytes()
    i = 2
    while i + 9 < len(d):
        if d[i] != 0xFF:
            i += 1
            continue
        marker = d[i + 1]
        if marker in (0xC0, 0xC1, 0xC2):
            h, w = struct.unpack(">HH", d[i + 5 : i + 9])
            return w, h
        i += 2 + struct.unpack(">H", d[i + 2 : i + 4])[0]
    raise ValueError(f"{path}: no JPEG frame header")


def yolo_subset(dest, keep_image, keep_box, names):
    """A flat YOLO folder at `dest` of coco128's images for which `keep_image(label lines,
    (w, h))` holds, each label file keeping the lines `keep_box` keeps (renumbered by `names`,
    a map from coco128's class id to the new one); images are links, not copies."""
    src = DATA / "coco128"
    if (dest / "classes.txt").exists():
        return
    (dest / "images").mkdir(parents=True, exist_ok=True)
    (dest / "labels").mkdir(parents=True, exist_ok=True)
    all_names = coco_names()
    for label in sorted((src / "labels").glob("*.txt")):
        image = src / "images" / (label.stem + ".jpg")
        if not image.exists():
            continue
        lines = [l.split() for l in label.read_text().splitlines() if l.strip()]
        if not keep_image(lines, jpeg_size(image)):
            continue
        kept = [
            " ".join([str(names[int(l[0])])] + l[1:])
            for l in lines
            if int(l[0]) in names and keep_box(l)
        ]
        (dest / "labels" / label.name).write_text("".join(k + "\n" for k in kept))
        link = dest / "images" / image.name
        if not link.exists():
            link.symlink_to(image)
    inverse = sorted(names.items(), key=lambda kv: kv[1])
    (dest / "classes.txt").write_text("".join(all_names[old] + "\n" for old, _ in inverse))


def coco_names():
    names = {}
    in_names = False
    for line in (DATA / "coco128" / "data.yaml").read_text().splitlines():
        if line.startswith("names:"):
            in_names = True
        elif in_names and ":" in line and line.startswith("  "):
            k, v = line.strip().split(":", 1)
            names[int(k)] = v.strip()
    return names


def prepare(fulcrum, work, name):
    """Packs set `name` (once) and returns (train pack, held-out pack)."""
    train, val = work / "data" / name, work / "data" / (name + "-val")
    if (train / "manifest.json").exists() and (val / "manifest.json").exists():
        return train, val
    log = work / "data" / (name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    pack = [fulcrum, "pack", "--size", str(SIZE), "--force"]
    split = ["--out", str(train), "--holdout-out", str(val)]
    if name.startswith("raccoon-h"):
        seed = name[len("raccoon-h") :]
        run(pack + [str(DATA / "raccoon"), "--holdout", "0.2", "--holdout-seed", seed] + split, log)
    elif name == "coco128":
        run(pack + [str(DATA / "coco128"), "--holdout", "0.2"] + split, log)
    elif name == "coco128-person":
        src = work / "sources" / "coco128-person"
        yolo_subset(src, lambda lines, wh: True, lambda l: True, {0: 0})
        run(pack + [str(src), "--holdout", "0.2"] + split, log)
    elif name == "synthetic":
        run(pack + ["--synthetic", "1024", "--seed", "1", "--out", str(train)], log)
        run(pack + ["--synthetic", "256", "--seed", "2", "--out", str(val)], log)
    else:
        sys.exit(f"unknown set {name!r}: the sets are {', '.join(SETS)}")
    return train, val


def train_and_score(fulcrum, work, variant, extra, name, seed):
    train, val = prepare(fulcrum, work, name)
    out = work / "runs" / variant / f"{name}-s{seed}"
    # Not in the results: a run that was interrupted starts over.
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [fulcrum, "train", "--data", str(train), "--out", str(out), "--recipe", "photos"]
    cmd += ["--seed", str(seed)] + shlex.split(extra)
    started = time.monotonic()
    run(cmd, out / "train.log")
    seconds = time.monotonic() - started
    score = out / "eval.json"
    run(
        [fulcrum, "eval", "--weights", str(out / "last.safetensors"), "--data", str(val)]
        + ["--json", str(score)],
        out / "eval.log",
    )
    e = json.loads(score.read_text())
    sizes = {s["size"]: s for s in e["sizes"]}
    return {
        "variant": variant,
        "extra": extra,
        "set": name,
        "seed": seed,
        "map": e["map"],
        "map_50_95": e["map_50_95"],
        **{f"ap_{k}": sizes.get(k, {}).get("map") for k in ("small", "medium", "large")},
        **{f"truth_{k}": sizes.get(k, {}).get("truth") for k in ("small", "medium", "large")},
        "train_seconds": round(seconds, 1),
        "held_out_images": e["images"],
    }


def mean_spread(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


COLUMNS = ["map", "map_50_95", "ap_small", "ap_medium", "ap_large"]


def table_row(variant, label, runs, cells, seconds=None):
    """One markdown row; the seconds cell stays empty without them."""
    last = f" {seconds} |" if seconds else " |"
    print(f"| {variant} | {label} | {runs} | " + " | ".join(cells) + " |" + last)


def report(results):
    """A markdown table: one row per variant and set, and one per variant over all sets."""
    head = "| variant | set | runs | mAP@0.5 | mAP@[.5:.95] | AP small | AP medium | AP large | train s |"
    print(head)
    print("|" + "---|" * 9)
    spread = lambda rows: [mean_spread([r[c] for r in rows]) for c in COLUMNS]
    variants = list(dict.fromkeys(r["variant"] for r in results))
    for v in variants:
        mine = [r for r in results if r["variant"] == v]
        for name in [s for s in SETS if any(r["set"] == s for r in mine)]:
            rows = [r for r in mine if r["set"] == name]
            secs = statistics.mean(r["train_seconds"] for r in rows)
            table_row(v, name, len(rows), spread(rows), f"{secs:.0f}")
        raccoon = [r for r in mine if r["set"].startswith("raccoon-h")]
        if raccoon:
            table_row(v, "**raccoon, all hold-outs**", len(raccoon), spread(raccoon))
        # Every set counts once: the mean of each set's mean.
        per_set = {}
        for r in mine:
            per_set.setdefault("raccoon" if r["set"].startswith("raccoon") else r["set"], []).append(r)
        cells = []
        for c in COLUMNS:
            means = [
                statistics.mean(x) for x in
                ([r[c] for r in rows if r[c] is not None] for rows in per_set.values()) if x
            ]
            cells.append(f"{statistics.mean(means):.3f}" if means else "–")
        table_row(v, "**mean over sets**", len(mine), cells)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "cross-data")
    p.add_argument("--fulcrum", default=str(ROOT / "target" / "release" / "fulcrum"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--raccoon-seeds", type=int, nargs="+", default=[0],
                   help="training seeds of each raccoon hold-out (three hold-outs already)")
    p.add_argument("--sets", nargs="+", default=SETS, choices=SETS)
    p.add_argument("--variant", action="append", default=[], metavar='NAME="ARGS"')
    p.add_argument("--report", action="store_true", help="print the table of OUT/results.jsonl")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results_file = a.out / "results.jsonl"
    results = [json.loads(l) for l in results_file.read_text().splitlines()] if results_file.exists() else []
    if not a.report:
        if not os.access(a.fulcrum, os.X_OK):
            sys.exit(f"{a.fulcrum}: no fulcrum binary; run `cargo build --release` first")
        variants = [v.split("=", 1) if "=" in v else (v, "") for v in a.variant] or [("recipe", "")]
        for name in a.sets:
            seeds = a.raccoon_seeds if name.startswith("raccoon-h") else a.seeds
            for seed in seeds:
                for variant, extra in variants:
                    if any(r["variant"] == variant and r["set"] == name and r["seed"] == seed for r in results):
                        continue
                    print(f"[{time.strftime('%H:%M:%S')}] {variant} on {name}, seed {seed}", flush=True)
                    r = train_and_score(a.fulcrum, a.out, variant, extra, name, seed)
                    print(f"    mAP@0.5 {r['map']:.3f}, mAP@[.5:.95] {r['map_50_95']:.3f}, "
                          f"AP small {r['ap_small']}, {r['train_seconds']:.0f} s", flush=True)
                    results.append(r)
                    with open(results_file, "a") as f:
                        f.write(json.dumps(r) + "\n")
    report(results)


if __name__ == "__main__":
    main()
