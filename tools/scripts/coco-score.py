#!/usr/bin/env python3
"""Scores `fulcrum infer --coco` results with pycocotools, the reference COCO scorer.

A developer tool (not a test): it checks `fulcrum eval`'s COCO figures against COCOeval on
the same images. Ground truth comes from the source dataset (Pascal VOC XML or YOLO txt
labels), restricted to the images listed in LIST (a packed dataset's sources.txt), with the
ids `fulcrum infer --coco` gives without --coco-ids: image ids are positions in LIST from 1
(or the file names' numbers when every name is one), category ids the class indices of the
packed dataset's manifest.json.

    pip install pycocotools
    fulcrum pack ../shared/data/raccoon --out train --holdout 0.2 --holdout-out val
    fulcrum train --data train --out run ...
    fulcrum infer --weights run/last.safetensors $(cat val/sources.txt) --coco val.json
    fulcrum eval --weights run/last.safetensors --data val --json eval.json
    python3 tools/scripts/coco-score.py val val.json --eval eval.json
"""
import argparse
import json
import pathlib
import sys
import xml.etree.ElementTree as ET

from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval


def voc_boxes(image, classes):
    xml = image.parent.parent / "annotations" / (image.stem + ".xml")
    root = ET.parse(xml).getroot()
    for obj in root.iter("object"):
        b = obj.find("bndbox")
        x0, y0, x1, y1 = (float(b.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax"))
        # VOC's pixels are 1-based and inclusive (as pack reads them).
        x0, y0 = x0 - 1, y0 - 1
        yield classes.index(obj.find("name").text.strip()), (x0, y0, x1, y1)


def yolo_boxes(image, w, h):
    txt = image.parent.parent / "labels" / (image.stem + ".txt")
    if not txt.exists():
        return
    for line in txt.read_text().splitlines():
        if not line.strip():
            continue
        c, cx, cy, bw, bh = line.split()[:5]
        cx, cy, bw, bh = float(cx) * w, float(cy) * h, float(bw) * w, float(bh) * h
        yield int(c), (cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2)


def ground_truth(packed):
    classes = json.loads((packed / "manifest.json").read_text())["classes"]
    images = [pathlib.Path(l) for l in (packed / "sources.txt").read_text().split("\n") if l]
    numbers = [im.stem for im in images]
    if all(n.isdigit() for n in numbers) and len(set(numbers)) == len(numbers):
        ids = [int(n) for n in numbers]
    else:
        ids = list(range(1, len(images) + 1))
    gt = {"images": [], "annotations": [], "categories": []}
    gt["categories"] = [{"id": i, "name": n} for i, n in enumerate(classes)]
    for image_id, image in zip(ids, images):
        w, h = Image.open(image).size
        gt["images"].append({"id": image_id, "file_name": image.name, "width": w, "height": h})
        if (image.parent.parent / "annotations").is_dir():
            boxes = voc_boxes(image, classes)
        else:
            boxes = yolo_boxes(image, w, h)
        for c, (x0, y0, x1, y1) in boxes:
            # Clipped to the image, as pack clips them.
            x0, x1 = max(0.0, min(x0, w)), max(0.0, min(x1, w))
            y0, y1 = max(0.0, min(y0, h)), max(0.0, min(y1, h))
            gt["annotations"].append({
                "id": len(gt["annotations"]) + 1, "image_id": image_id, "category_id": c,
                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                "iscrowd": 0,
            })
    return gt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("packed", type=pathlib.Path, help="packed dataset folder (sources.txt)")
    p.add_argument("results", type=pathlib.Path, help="fulcrum infer --coco output")
    p.add_argument("--eval", type=pathlib.Path, help="fulcrum eval --json output to compare")
    a = p.parse_args()
    gt = COCO()
    gt.dataset = ground_truth(a.packed)
    gt.createIndex()
    results = json.loads(a.results.read_text())
    dt = gt.loadRes(results) if results else COCO()
    e = COCOeval(gt, dt, "bbox")
    e.evaluate()
    e.accumulate()
    e.summarize()
    # stats: AP[.5:.95], AP50, AP75, AP small, medium, large (-1: no boxes of that size).
    ours = {"map_50_95": e.stats[0], "map": e.stats[1], "small": e.stats[3],
            "medium": e.stats[4], "large": e.stats[5]}
    if a.eval:
        f = json.loads(a.eval.read_text())
        theirs = {"map_50_95": f["map_50_95"], "map": f["map"]}
        for s in f["sizes"]:
            theirs[s["size"]] = -1.0 if s["map_50_95"] is None else s["map_50_95"]
        print(f"{'figure':<12} {'pycocotools':>12} {'fulcrum eval':>13} {'difference':>11}")
        worst = 0.0
        for k, v in ours.items():
            d = theirs[k] - v
            worst = max(worst, abs(d))
            print(f"{k:<12} {v:>12.4f} {theirs[k]:>13.4f} {d:>+11.4f}")
        print(f"largest difference {worst:.4f}")


if __name__ == "__main__":
    sys.exit(main())
