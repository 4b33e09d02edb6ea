#!/usr/bin/env python3
"""Fine-tuning on the board, measured: held-out mAP@0.5 against training seconds.

Scenario 1, a new class: a det-m@256 base trained on coco128 (the photo recipe) fine-tuned to
raccoon (de-duplicated 80/20 split, hold-out seed 0).
Scenario 2, a new place: a base trained on the raccoon training split fine-tuned on the same
photos with a colour cast and a smaller scale (the transform below), with and without replay of
the base's own data; scored on the shifted hold-out and, for forgetting, on the original one.

Scenario 3, the new place from fulcrumd while a camera sends 640×480 NV12 frames at 30 frames/s
through a memfd ring: `fulcrum bench serve --fine-tune-data` starts a fresh fine-tune of the
scenario-2 base on the shifted set for each floor on its share (0 and 0.25) and follows the
held-out mAP@0.5 the daemon scores after each epoch; latency and steps/s beside the idle daemon
and the unloaded fine-tune.

Each variant of scenarios 1 and 2 (--freeze none | early | backbone | backbone+neck, the last two
also with --train-biases, named "biases"; "backbone long", the frozen backbone on 2.5 times the
recipe's epochs, which fill the seconds a frozen run has spare; training from scratch; and
"builtin", the recipe's own start, the built-in base, with no scenario base) runs the photo
recipe's schedule in segments of `train --max-time` (15, 15, 30, 60 s: the checkpoint after 15,
30, 60 and 120 s of training steps; `--resume` continues exactly where the last stopped) and
every checkpoint is scored with `fulcrum eval`. A variant that finishes the schedule sooner keeps
its last score. Results go to OUT/results.jsonl as they come (an interrupted run continues);
`--report` prints the tables.

    python3 tools/scripts/fine-tune-scenarios.py --out runs/scenarios [--scenario 1 2]
    python3 tools/scripts/fine-tune-scenarios.py --out runs/scenarios --report

More training seeds: `--seed N` (N > 0) runs the variants again with `train --seed N` (the
base models stay those of seed 0), as rows named "... seed N"; `--only "backbone biases" none`
restricts a run to those variants. The report adds, for a variant with several seeds, the mean
and the range over them.

The bases: `--bases-from builtin` (the default) trains them as `train --recipe photos` does,
from the built-in base (a det-m trained on synthetic images); `--bases-from scratch` from random
weights, as the journal's first runs did. Give each its own --out.

The shift (scenario 2): every raccoon photo is scaled to 0.6 of its size and placed on a grey
(114) canvas of the original size at an offset drawn from the MD5 of its file name (objects
smaller, anywhere in the frame), then colour cast: red ×1.2, blue ×0.75, and a gamma of 0.8
on all channels (a warm, brighter light). Needs Pillow.
"""

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
BIN = ROOT / "target" / "release" / "fulcrum"
SEGMENTS = [15, 15, 30, 60]  # seconds of training steps per segment: checkpoints at 15/30/60/120
FREEZES = ["none", "early", "backbone", "backbone+neck"]
FROZEN = ["backbone", "backbone+neck"]  # the choices measured with --train-biases too


def run(args, log):
    started = time.monotonic()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, args))}\n")
        f.flush()
        p = subprocess.run(list(map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        f.write(p.stdout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, args))}\n{p.stdout[-3000:]}")
    return p.stdout, time.monotonic() - started


def pack(source, out, log, holdout=None):
    if (out / "manifest.json").exists():
        return
    args = [BIN, "pack", source, "--out", out, "--size", "256"]
    if holdout:
        args += ["--holdout", "0.2", "--holdout-seed", "0", "--holdout-out", holdout]
    run(args, log)


def shifted_raccoon(out):
    """The raccoon photos under the documented shift, as a YOLO folder."""
    from PIL import Image

    if (out / "classes.txt").exists():
        return out
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "labels").mkdir(parents=True, exist_ok=True)
    scale, red, blue, gamma = 0.6, 1.2, 0.75, 0.8
    lut = [min(255, round(255 * (v / 255) ** gamma)) for v in range(256)]
    for xml in sorted((DATA / "raccoon" / "annotations").glob("*.xml")):
        root = ET.parse(xml).getroot()
        name = root.findtext("filename")
        img = Image.open(DATA / "raccoon" / "images" / name).convert("RGB")
        w, h = img.size
        sw, sh = round(w * scale), round(h * scale)
        digest = hashlib.md5(name.encode()).digest()
        ox, oy = (w - sw) * digest[0] // 255, (h - sh) * digest[1] // 255
        canvas = Image.new("RGB", (w, h), (114, 114, 114))
        canvas.paste(img.resize((sw, sh), Image.BILINEAR), (ox, oy))
        r, g, b = canvas.split()
        r = r.point(lambda v: min(255, round(v * red)))
        b = b.point(lambda v: round(v * blue))
        shifted = Image.merge("RGB", (r, g, b)).point(lut * 3)
        shifted.save(out / "images" / name, quality=92)
        lines = []
        for obj in root.iter("object"):
            bb = obj.find("bndbox")
            x0, y0, x1, y1 = (float(bb.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
            x0, x1 = ox + x0 * scale, ox + x1 * scale
            y0, y1 = oy + y0 * scale, oy + y1 * scale
            lines.append(f"0 {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}")
        (out / "labels" / (Path(name).stem + ".txt")).write_text("\n".join(lines) + "\n")
    (out / "classes.txt").write_text("raccoon\n")
    return out


def score(weights, data, log):
    out = Path(str(weights) + f".{Path(data).parent.name}-{Path(data).name}.eval.json")
    run([BIN, "eval", "--weights", weights, "--data", data, "--json", out], log)
    return json.loads(out.read_text())["map"]


def base(name, data, work, log):
    """A base model trained with the photo recipe (once), from random weights or the built-in base."""
    out = work / "bases" / name
    if not (out / "last.safetensors").exists():
        start = ["--from-scratch"] if BASES_FROM == "scratch" else []
        run([BIN, "train", "--data", data, "--out", out, "--recipe", "photos"] + start, log)
    return out / "last.safetensors"


SEED = 0  # --seed
ONLY = None  # --only
BASES_FROM = "builtin"  # --bases-from


def variant(key, train_args, out, evals, work, log, results):
    """The recipe's schedule in --max-time segments, every checkpoint scored."""
    if ONLY is not None and key[3:] not in ONLY:
        return
    if SEED:
        key, out = f"{key} seed {SEED}", out.with_name(f"{out.name}-seed{SEED}")
        train_args = train_args + ["--seed", SEED]
    done = {(r["key"], r["seconds"]) for r in results}
    seconds = 0
    for segment in SEGMENTS:
        seconds += segment
        if (key, seconds) in done:
            continue
        ckpt = out / "last.safetensors"
        previous = text_of(out)
        if ckpt.exists() and finished(previous):
            text, wall = previous, 0.0  # the schedule is done: its score stays
        else:
            args = [BIN, "train", "--out", out, "--recipe", "photos", "--max-time", f"{segment}s"] + train_args
            if ckpt.exists():
                args = strip_init(args) + ["--resume"]
            text, wall = run(args, log)
            (out / "last-output.txt").write_text(text)
        peak = re.search(r"peak resident ([\d.]+ \w+)", text)
        step = re.search(r"at step (\d+)", text)
        row = {
            "key": key,
            "seconds": seconds,
            "step": int(step.group(1)) if step else None,
            "peak": peak.group(1) if peak else None,
            "wall": round(wall, 1),
        }
        for name, data in evals.items():
            row[name] = score(ckpt, data, log)
        print(json.dumps(row), flush=True)
        with open(work / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        results.append(row)


def text_of(out):
    p = out / "last-output.txt"
    return p.read_text() if p.exists() else ""


def finished(text):
    """The last segment ran the schedule to its end: nothing left to resume."""
    done, total = re.search(r"done at step (\d+)", text), re.search(r"steps \d+\.\.(\d+)", text)
    return bool(done and total and int(done.group(1)) >= int(total.group(1)))


def strip_init(args):
    """--resume takes the run's own checkpoint: --init-from (ignored) goes."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--init-from":
            skip = True
            continue
        out.append(a)
    return out


def recipe_epochs(data):
    """The photo recipe's epochs for a pack: about 1200 steps of batch 16, 30 to 300 (the rule of
    runtime/src/train/recipe.rs, PHOTO_STEPS: keep the two alike)."""
    steps = json.loads((data / "manifest.json").read_text())["records"] // 16
    return min(300, max(30, -(-1200 // steps)))


def scenario1(work, log, results):
    coco = work / "data" / "coco128"
    pack(DATA / "coco128", coco, log)
    rac, rac_val = work / "data" / "raccoon" / "train", work / "data" / "raccoon" / "val"
    pack(DATA / "raccoon", rac, log, holdout=rac_val)
    b = base("coco128", coco, work, log)
    evals = {"raccoon_val": rac_val}
    for f in FREEZES:
        variant(f"s1 {f}", ["--data", rac, "--init-from", b, "--freeze", f], work / "s1" / f, evals, work, log, results)
    for f in FROZEN:
        variant(f"s1 {f} biases", ["--data", rac, "--init-from", b, "--freeze", f, "--train-biases"],
                work / "s1" / f"{f}-biases", evals, work, log, results)
    long = ["--epochs", str(recipe_epochs(rac) * 5 // 2)]
    variant("s1 backbone long", ["--data", rac, "--init-from", b, "--freeze", "backbone"] + long,
            work / "s1" / "backbone-long", evals, work, log, results)
    variant("s1 scratch", ["--data", rac, "--from-scratch"], work / "s1" / "scratch", evals, work, log, results)
    variant("s1 builtin", ["--data", rac], work / "s1" / "builtin", evals, work, log, results)


def scenario2(work, log, results):
    rac, rac_val = work / "data" / "raccoon" / "train", work / "data" / "raccoon" / "val"
    pack(DATA / "raccoon", rac, log, holdout=rac_val)
    src = shifted_raccoon(work / "shifted-src")
    sh, sh_val = work / "data" / "shifted" / "train", work / "data" / "shifted" / "val"
    pack(src, sh, log, holdout=sh_val)
    b = base("raccoon", rac, work, log)
    evals = {"shifted_val": sh_val, "raccoon_val": rac_val}
    for f in FREEZES:
        variant(f"s2 {f}", ["--data", sh, "--init-from", b, "--freeze", f], work / "s2" / f, evals, work, log, results)
        variant(f"s2 {f} replay", ["--data", sh, "--init-from", b, "--freeze", f, "--replay", rac],
                work / "s2" / f"{f}-replay", evals, work, log, results)
    # The frozen runs end the recipe's schedule in half the seconds: a longer one fills them.
    long = ["--epochs", str(recipe_epochs(sh) * 5 // 2)]
    variant("s2 backbone long", ["--data", sh, "--init-from", b, "--freeze", "backbone"] + long,
            work / "s2" / "backbone-long", evals, work, log, results)
    for f in FROZEN:
        variant(f"s2 {f} biases", ["--data", sh, "--init-from", b, "--freeze", f, "--train-biases"],
                work / "s2" / f"{f}-biases", evals, work, log, results)
        variant(f"s2 {f} biases replay",
                ["--data", sh, "--init-from", b, "--freeze", f, "--train-biases", "--replay", rac],
                work / "s2" / f"{f}-biases-replay", evals, work, log, results)
    variant("s2 scratch", ["--data", sh, "--from-scratch"], work / "s2" / "scratch", evals, work, log, results)
    variant("s2 builtin", ["--data", sh], work / "s2" / "builtin", evals, work, log, results)


def scenario3(work, log):
    """fulcrumd fine-tuning under a camera's load, per --freeze (bench serve writes JSON)."""
    data = work / "s3data"
    data.mkdir(exist_ok=True)
    for split in ("train", "val"):
        link = data / split
        if not link.exists():
            link.symlink_to(work / "data" / "shifted" / split)
    b = work / "bases" / "raccoon" / "last.safetensors"
    for f in FREEZES:
        out = work / f"s3-{f}.json"
        if out.exists():
            continue
        run([BIN, "bench", "serve", "--weights", b, "--engine", "cpu", "--clients", "1", "--rate", "30",
             "--seconds", "5", "--width", "640", "--height", "480", "--format", "nv12",
             "--fine-tune-data", data, "--fine-tune-freeze", f, "--fine-tune-seconds", "120",
             "--paced-only", "--fine-tune-shares", "0,0.25", "--json", out], log)


def report3(work):
    files = [(f, work / f"s3-{f}.json") for f in FREEZES]
    files = [(f, json.loads(p.read_text())) for f, p in files if p.exists()]
    if not files:
        return
    print("\nscenario 3 (fulcrumd, 640×480 NV12 at 30 frames/s, memfd)")
    print("  {:<15} {:>5} {:>7} {:>7} {:>7} {:>7}   {:>8} {:>9} {:>10} {:>9}".format(
        "--freeze", "share", "15 s", "30 s", "60 s", "120 s", "p99 ms", "idle p99", "steps/s", "unloaded"))
    for f, r in files:
        idle = next(x for x in r["runs"] if x["load"] == "paced" and not x["fine_tuning"])
        for x in (x for x in r["runs"] if x["fine_tuning"]):
            def at(t):
                pts = [p for p in x["fine_tune_curve"] if p["seconds"] <= t and p["held_out_map"] is not None]
                return f"{pts[-1]['held_out_map']:.3f}" if pts else "-"
            secs = x["frames"] / x["frames_per_s"]
            print("  {:<15} {:>5} {:>7} {:>7} {:>7} {:>7}   {:>8.2f} {:>9.2f} {:>10.1f} {:>9.1f}".format(
                f, x["fine_tune_share"], at(15), at(30), at(60), at(120), x["p99_ms"], idle["p99_ms"],
                x["fine_tune_steps"] / secs, r["fine_tune_idle_steps_per_s"]))


def report(work):
    rows = [json.loads(l) for l in (work / "results.jsonl").read_text().splitlines() if l.strip()]
    keys = list(dict.fromkeys(r["key"] for r in rows))
    for scenario, metrics in (("s1", ["raccoon_val"]), ("s2", ["shifted_val", "raccoon_val"])):
        mine = [k for k in keys if k.startswith(scenario + " ")]
        if not mine:
            continue
        print(f"\nscenario {scenario[1]}")
        for metric in metrics:
            print(f"  held-out mAP@0.5 on {metric}:")
            print("  {:<28} {:>7} {:>7} {:>7} {:>7}   steps at 120 s   peak RSS".format("variant", "15 s", "30 s", "60 s", "120 s"))
            for k in mine:
                by = {r["seconds"]: r for r in rows if r["key"] == k}
                cells = [f"{by[s][metric]:.3f}" if s in by else "-" for s in (15, 30, 60, 120)]
                last = by.get(120, {})
                print("  {:<28} {:>7} {:>7} {:>7} {:>7}   {:>14}   {}".format(
                    k[3:], *cells, str(last.get("step", "-")), last.get("peak", "-")))
            seeded = [k for k in mine if " seed " not in k and any(m.startswith(k + " seed ") for m in mine)]
            if seeded:
                print(f"  across seeds (mean, min-max) on {metric}:")
            for k in seeded:
                family = [k] + [m for m in mine if m.startswith(k + " seed ")]
                cells = []
                for sec in (15, 30, 60, 120):
                    v = [r[metric] for r in rows if r["key"] in family and r["seconds"] == sec]
                    cells.append(f"{sum(v) / len(v):.3f} ({min(v):.2f}-{max(v):.2f})" if v else "-")
                print("  {:<28} {:>17} {:>17} {:>17} {:>17}   {} seeds".format(k[3:], *cells, len(family)))
    report3(work)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scenario", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--seed", type=int, default=0, help="train --seed for the variants (0: the first runs)")
    ap.add_argument("--only", nargs="*", help="run only these variants (names as in the report)")
    ap.add_argument("--bases-from", choices=["builtin", "scratch"], default="builtin",
                    help="train the scenario bases as `train --recipe photos` does, from the built-in "
                    "base (the default), or from random weights (the journal's first runs); "
                    "use another --out for each")
    a = ap.parse_args()
    global SEED, ONLY, BASES_FROM
    SEED, ONLY, BASES_FROM = a.seed, a.only, a.bases_from
    a.out.mkdir(parents=True, exist_ok=True)
    if a.report:
        report(a.out)
        return
    if not BIN.exists():
        sys.exit(f"{BIN} is missing: cargo build --release --bin fulcrum")
    path = a.out / "results.jsonl"
    results = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    log = a.out / "log.txt"
    if 1 in a.scenario:
        scenario1(a.out, log, results)
    if 2 in a.scenario:
        scenario2(a.out, log, results)
    if 3 in a.scenario:
        scenario3(a.out, log)
    report(a.out)


if __name__ == "__main__":
    main()
