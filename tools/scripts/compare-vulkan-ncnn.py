#!/usr/bin/env python3
"""det-s forward at batch 1 on one Vulkan device, side by side: fulcrum's Vulkan engine against
ncnn's Vulkan backend running the same det-s (fulcrum's ONNX export converted with pnnx), on
the same driver, in one run with the two alternating round by round (the machines are shared
and noisy).

A developer tool, not a test. It needs a release build of fulcrum and, in the Python it runs
with, PyPI's `ncnn` (built with Vulkan) and `pnnx`:

    python3 -m venv /tmp/ncnn && /tmp/ncnn/bin/pip install ncnn pnnx numpy
    cargo build --release
    /tmp/ncnn/bin/python tools/scripts/compare-vulkan-ncnn.py --rounds 3

The det-s weights come from a one-step training run on the built-in synthetic dataset (the
time of a forward pass does not depend on the values). Transfers are counted on both sides:
fulcrum's figure is `bench compute`'s forward at batch 1 with its transfers (`with_io_ms`: the
records written from host memory, the pass, the detections read back; the pass includes the
decoder, which ncnn's graph, ending at the output maps, does not run), ncnn's the wall time of
one `extract` (upload, dispatches, download) with its GPU pipelines and blobs allocated once
before timing. fulcrum's GPU time of the dispatches alone (`device`, timestamps) is printed
beside it. ncnn runs twice, with its fp16 storage and arithmetic on (its default) and off,
alternating; the faster counts, as a GPU without fast fp16 may prefer fp32.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

INPUT = 128


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out


def prepare(binary, tmp):
    """Packs a small synthetic set, trains det-s one step, exports ONNX, converts it to ncnn."""
    data, out = os.path.join(tmp, "data"), os.path.join(tmp, "run")
    run([binary, "pack", "--synthetic", "64", "--out", data])
    run([binary, "train", "--data", data, "--out", out, "--engine", "cpu", "--max-steps", "1"])
    onnx = os.path.join(tmp, "det_s.onnx")
    run([binary, "export", "--weights", os.path.join(out, "last.safetensors"), "--onnx", onnx])
    # The `pnnx` command pip installs beside this Python (or on the PATH).
    pnnx = os.path.join(os.path.dirname(sys.executable), "pnnx")
    pnnx = pnnx if os.path.exists(pnnx) else shutil.which("pnnx")
    if pnnx is None:
        sys.exit("no `pnnx` command: pip install pnnx (in the Python that runs this script)")
    run([pnnx, onnx, f"inputshape=[1,3,{INPUT},{INPUT}]"], cwd=tmp)
    param, bin_ = (os.path.join(tmp, f"det_s.ncnn.{ext}") for ext in ("param", "bin"))
    if not (os.path.exists(param) and os.path.exists(bin_)):
        sys.exit(f"pnnx wrote no det_s.ncnn.param/.bin in {tmp}: {os.listdir(tmp)}")
    return param, bin_


def fulcrum_forward(binary, runs, device):
    """`bench compute`'s forward at batch 1 on each Vulkan engine it measured (f32, and fp16
    where the device has fast f16): `{engine: (with transfers ms, device ms)}`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "compute.json")
        cmd = [binary, "bench", "compute", "--runs", str(runs), "--batch", "1", "--json", out]
        if device is not None:
            cmd += ["--device", str(device)]
        run(cmd)
        engines = json.load(open(out))["engines"]
    vulkan = {e["engine"]: (e["forward_batch1"]["with_io_ms"], e["forward_batch1"]["device_ms"])
              for e in engines if e["engine"].startswith("vulkan")}
    if not vulkan:
        sys.exit(f"bench compute measured no Vulkan engine: {[e['engine'] for e in engines]}")
    return vulkan


def ncnn_net(param, bin_, device, fp16):
    import ncnn

    if ncnn.get_gpu_count() == 0:
        sys.exit("ncnn sees no Vulkan device (is this ncnn built with Vulkan? is a driver there?)")
    net = ncnn.Net()
    net.opt.use_vulkan_compute = True
    net.opt.use_fp16_packed = fp16
    net.opt.use_fp16_storage = fp16
    net.opt.use_fp16_arithmetic = fp16
    if device is not None:
        net.set_vulkan_device(device)
    if net.load_param(param) != 0 or net.load_model(bin_) != 0:
        sys.exit(f"ncnn could not load {param}")
    name = ncnn.get_gpu_info(device or ncnn.get_default_gpu_index()).device_name()
    return net, name


def ncnn_forward(net, runs):
    import ncnn
    import numpy as np

    x = ncnn.Mat(np.random.default_rng(0).random((3, INPUT, INPUT), dtype=np.float32))

    def forward():
        with net.create_extractor() as ex:
            ex.input("in0", x)
            ret, out = ex.extract("out0")
            if ret != 0:
                sys.exit(f"ncnn extract failed ({ret})")
            np.asarray(out)

    for _ in range(5):  # warm-up: pipelines, blob allocators
        forward()
    return statistics.median(elapsed_ms(forward) for _ in range(runs))


def elapsed_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fulcrum", default="target/release/fulcrum")
    p.add_argument("--device", type=int, help="Vulkan device index (both), default each's best")
    p.add_argument("--runs", type=int, default=20, help="timed runs per figure (medians)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of both, alternating")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        param, bin_ = prepare(a.fulcrum, tmp)
        nets = {f"fp16 {'on' if fp16 else 'off'}": ncnn_net(param, bin_, a.device, fp16)
                for fp16 in (True, False)}
        ncnn_device = next(iter(nets.values()))[1]
        # Per round: {"fulcrum": {engine: with transfers}, "fulcrum_device": {engine: device
        # time}, "ncnn": {setting: ms}}.
        rounds = []
        for r in range(a.rounds):
            row = {"fulcrum": {}, "fulcrum_device": {}, "ncnn": {}}

            def fulcrum_side():
                for engine, (io_ms, device_ms) in fulcrum_forward(a.fulcrum, a.runs, a.device).items():
                    row["fulcrum"][engine], row["fulcrum_device"][engine] = io_ms, device_ms

            def ncnn_side():
                # ncnn's two settings in alternating order, round by round.
                for name in (list(nets) if r % 2 == 0 else list(reversed(nets))):
                    row["ncnn"][name] = ncnn_forward(nets[name][0], a.runs)

            # Which side goes first alternates too.
            for side in ((fulcrum_side, ncnn_side) if r % 2 == 0 else (ncnn_side, fulcrum_side)):
                side()
            rounds.append(row)
            print(f"round {r + 1}: fulcrum with transfers "
                  + ", ".join(f"{e} {ms:.2f} ms (device {row['fulcrum_device'][e]:.2f})"
                              for e, ms in row["fulcrum"].items())
                  + f"; ncnn-vulkan ({ncnn_device}) "
                  + ", ".join(f"{name} {ms:.2f} ms" for name, ms in row["ncnn"].items()),
                  flush=True)
    med = {side: {k: statistics.median(r[side][k] for r in rounds) for k in rounds[0][side]}
           for side in rounds[0]}
    best_f = min(med["fulcrum"], key=med["fulcrum"].get)
    best_n = min(med["ncnn"], key=med["ncnn"].get)
    print(f"det-s forward, batch 1, transfers counted on both sides, medians of {a.rounds} rounds "
          f"× {a.runs} runs: fulcrum "
          + ", ".join(f"{e} {ms:.2f} ms (device {med['fulcrum_device'][e]:.2f})"
                      for e, ms in med["fulcrum"].items())
          + "; ncnn-vulkan " + ", ".join(f"{k} {v:.2f} ms" for k, v in med["ncnn"].items())
          + f": fulcrum's better / ncnn's better ({best_n}) = "
          f"{med['fulcrum'][best_f] / med['ncnn'][best_n]:.2f}×")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ncnn_device": ncnn_device, "rounds": rounds, "median": med,
                       "best": {"fulcrum": best_f, "ncnn": best_n}}, f, indent=2)


if __name__ == "__main__":
    main()
