#!/usr/bin/env python3
"""The frame pass side by side with OpenCV: a camera frame (NV12, YUYV, RGB8, BGR8, GRAY8, RGBA8,
BGRA8) at 640×480, 1280×720 and 1920×1080 to the letterboxed model input (det-s 128 px, det-m
256 px), fulcrum's `bench frames` against what a robot's C++ or Python code does today with
OpenCV, in one run, alternating format by format (the machines are shared and noisy).

A developer tool, not a test. It needs a release build of fulcrum and, in the Python it runs
with, `opencv-python-headless` and `numpy`:

    python3 -m venv /tmp/cvenv && /tmp/cvenv/bin/pip install opencv-python-headless numpy
    cargo build --release --bin fulcrum
    /tmp/cvenv/bin/python tools/scripts/compare-frames-opencv.py --threads 1

OpenCV does the same work at its best settings: `cvtColor` to RGB (the YUV formats by their
`COLOR_YUV2RGB_*` codes, BT.601 limited range as fulcrum by default), `resize` to the content size
with `INTER_AREA` when shrinking and `INTER_LINEAR` when enlarging (what fulcrum's filter is), and
`copyMakeBorder` with the pad colour 114 into the square input, each call writing into arrays made
once. That is fulcrum's output too (8-bit RGB, pixels interleaved: the engines normalise as they
read it), so the first ratio is like for like. The second OpenCV figure adds the conversion to
NCHW float ÷ 255 (`dnn.blobFromImage`), the input other runtimes take; fulcrum does that inside
its first convolution. `--threads` sets OpenCV's threads and the pool fulcrum's pass may split a
frame's rows over (it does where that measured faster, as the daemon does).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import cv2
import numpy as np

FRAMES = [(640, 480), (1280, 720), (1920, 1080)]
INPUTS = [128, 256]
PAD = 114


def scene(w, h):
    """A camera-like RGB scene: gradients, edges, a little noise (as `bench frames` makes)."""
    rng = np.random.default_rng(7)
    x = np.arange(w)[None, :]
    y = np.arange(h)[:, None]
    edge = np.where(((x // 97) + (y // 61)) % 2 == 0, 60, 0)
    noise = lambda: rng.integers(0, 32, (h, w))
    r = (x * 255 // w + noise()) % 256
    g = ((y * 255 // h) // 2 + edge + noise()) % 256
    b = ((x + y) * 128 // (w + h) + 40 + noise()) % 256
    return np.stack([r, g, b], axis=2).astype(np.uint8)


def encode(rgb, fmt):
    """The scene as a frame of `fmt`, and OpenCV's code to turn it back into RGB."""
    h, w, _ = rgb.shape
    if fmt == "RGB8":
        return rgb.copy(), None
    if fmt == "BGR8":
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), cv2.COLOR_BGR2RGB
    if fmt == "RGBA8":
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2RGBA), cv2.COLOR_RGBA2RGB
    if fmt == "BGRA8":
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGRA), cv2.COLOR_BGRA2RGB
    if fmt == "GRAY8":
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB
    yuv = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)  # planar 4:2:0, h * 3/2 rows
    y_plane = yuv[:h]
    u = yuv[h : h + h // 4].reshape(h // 2, w // 2)
    v = yuv[h + h // 4 :].reshape(h // 2, w // 2)
    if fmt == "NV12":
        uv = np.stack([u, v], axis=2).reshape(h // 2, w)
        return np.vstack([y_plane, uv]), cv2.COLOR_YUV2RGB_NV12
    if fmt == "YUYV":
        u422 = np.repeat(u, 2, axis=0)
        v422 = np.repeat(v, 2, axis=0)
        out = np.empty((h, w * 2), np.uint8)
        out[:, 0::2] = y_plane
        out[:, 1::4] = u422
        out[:, 3::4] = v422
        return out.reshape(h, w, 2), cv2.COLOR_YUV2RGB_YUYV
    raise ValueError(fmt)


def place(size, w, h):
    """fulcrum's letterbox geometry (`Letterbox::place`)."""
    scale = min(size / w, size / h)
    cw = min(max(round(w * scale), 1), size)
    ch = min(max(round(h * scale), 1), size)
    return cw, ch, (size - cw) // 2, (size - ch) // 2


def time_opencv(frame, code, w, h, size, runs, blob):
    cw, ch, px, py = place(size, w, h)
    rgb = np.empty((h, w, 3), np.uint8)
    small = np.empty((ch, cw, 3), np.uint8)
    out = np.empty((size, size, 3), np.uint8)
    interp = cv2.INTER_AREA if cw < w else cv2.INTER_LINEAR
    borders = (py, size - ch - py, px, size - cw - px)

    def once():
        src = frame
        if code is not None:
            cv2.cvtColor(frame, code, dst=rgb)
            src = rgb
        cv2.resize(src, (cw, ch), dst=small, interpolation=interp)
        cv2.copyMakeBorder(small, *borders, cv2.BORDER_CONSTANT, dst=out, value=(PAD, PAD, PAD))
        if blob:
            return cv2.dnn.blobFromImage(out, 1.0 / 255.0)
        return out

    for _ in range(5):
        once()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        once()
        times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    return statistics.median(times), times[int(round((len(times) - 1) * 0.99))]


def time_fulcrum(binary, fmt, runs, threads):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "frames.json")
        env = dict(os.environ)
        subprocess.run(
            [binary, "bench", "frames", "--formats", fmt.lower(), "--runs", str(runs),
             "--best-only", "--threads", str(threads), "--json", path],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )
        with open(path) as f:
            figures = json.load(f)
    best = [f for f in figures if f["kernels"] != "portable"] or figures
    return {(f["frame"], f["input"]): (f["median_us"], f["p99_us"], f"{f['kernels']}/{f['bands']}")
            for f in best}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fulcrum", default="target/release/fulcrum")
    p.add_argument("--threads", type=int, default=1,
                   help="threads for both: OpenCV's, and the pool fulcrum's pass may split over")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--formats", default="NV12,YUYV,RGB8,BGR8,GRAY8,RGBA8,BGRA8")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    cv2.setNumThreads(a.threads)
    print(f"OpenCV {cv2.__version__} and fulcrum ({a.fulcrum}), {a.threads} thread(s) each; "
          f"{a.runs} runs a figure, medians (p99) in µs; kernels: fulcrum's set/bands chosen")
    print(f"  {'format':<6} {'frame':>10} {'input':>5} {'kernels':<10} {'fulcrum':>16} "
          f"{'OpenCV':>16} {'ratio':>6} {'OpenCV+NCHW':>16} {'ratio':>6}")
    rows = []
    for k, fmt in enumerate(a.formats.split(",")):
        fmt = fmt.strip().upper()
        measured = {}
        # Alternate which side runs first, format by format.
        order = ["fulcrum", "opencv"] if k % 2 == 0 else ["opencv", "fulcrum"]
        for side in order:
            if side == "fulcrum":
                measured["fulcrum"] = time_fulcrum(a.fulcrum, fmt, a.runs, a.threads)
            else:
                cv = {}
                for w, h in FRAMES:
                    frame, code = encode(scene(w, h), fmt)
                    for size in INPUTS:
                        cv[(f"{w}x{h}", size)] = (
                            time_opencv(frame, code, w, h, size, a.runs, False),
                            time_opencv(frame, code, w, h, size, a.runs, True),
                        )
                measured["opencv"] = cv
        for w, h in FRAMES:
            for size in INPUTS:
                key = (f"{w}x{h}", size)
                f_med, f_p99, kernels = measured["fulcrum"][key]
                (c_med, c_p99), (b_med, b_p99) = measured["opencv"][key]
                row = dict(format=fmt, frame=key[0], input=size, kernels=kernels,
                           fulcrum_median_us=f_med, fulcrum_p99_us=f_p99,
                           opencv_median_us=c_med, opencv_p99_us=c_p99,
                           opencv_nchw_median_us=b_med, opencv_nchw_p99_us=b_p99,
                           ratio=f_med / c_med, ratio_nchw=f_med / b_med)
                rows.append(row)
                print(f"  {fmt:<6} {key[0]:>10} {size:>5} {kernels:<10} "
                      f"{f_med:>7.0f} ({f_p99:>6.0f}) {c_med:>7.0f} ({c_p99:>6.0f}) "
                      f"{row['ratio']:>6.2f} {b_med:>7.0f} ({b_p99:>6.0f}) {row['ratio_nchw']:>6.2f}")
        sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(opencv=cv2.__version__, threads=a.threads, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
