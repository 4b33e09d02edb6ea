#!/usr/bin/env python3
"""det-s on PyTorch CUDA, for scale next to `fulcrum bench compute` on the same NVIDIA GPU:
forward latency at batch 1 and a training step (forward, MSE loss, backward, AdamW) at --batch.

A developer tool, not a test. It reuses compare-cpu-peers.py's layer-for-layer det-s (checked
against fulcrum's parameter count) and needs only `torch` with CUDA:

    python3 tools/scripts/torch-cuda-det-s.py --batch 32 --runs 50 --json torch-cuda.json

Each timed call ends in torch.cuda.synchronize(), so a figure is the whole step as a caller
waits for it (launches included), as fulcrum's step is measured to its fence. Eager mode,
float32, cuDNN's defaults (which may use TF32 on Ampere and later); `--graph` also times the
step replayed as a CUDA graph, which removes the launch overhead.
"""

import argparse
import importlib.util
import json
import os
import sys


def peers():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare-cpu-peers.py")
    spec = importlib.util.spec_from_file_location("compare_cpu_peers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--runs", type=int, default=50, help="timed runs per figure (medians)")
    p.add_argument("--graph", action="store_true", help="also time the step as a CUDA graph")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this script measures PyTorch on an NVIDIA GPU")
    m = peers()
    dev = torch.device("cuda")
    model = m.torch_det_s().to(dev)
    n = sum(q.numel() for q in model.parameters())
    if n != m.DET_S_PARAMS:
        sys.exit(f"the PyTorch det-s has {n} parameters, not {m.DET_S_PARAMS}")
    # A graph replays AdamW's step only with its state on the device (capturable).
    opt = torch.optim.AdamW(model.parameters(), 1e-3, capturable=a.graph)
    grid = m.INPUT // 8
    g = torch.Generator(device="cpu").manual_seed(0)
    xb = (torch.rand(a.batch, 3, m.INPUT, m.INPUT, generator=g) * 255).to(dev)
    yb = torch.randn(a.batch, m.CLASSES + 4, grid, grid, generator=g).to(dev)
    x1 = xb[:1].clone()

    def forward():
        with torch.no_grad():
            model(x1)
        torch.cuda.synchronize()

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        torch.cuda.synchronize()

    figures = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "batch": a.batch,
        "forward_b1_ms": m.median_ms(forward, a.runs, warmup=10),
        "step_ms": m.median_ms(step, a.runs, warmup=10),
    }
    if a.graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                opt.zero_grad(set_to_none=False)
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()

        def replay():
            graph.replay()
            torch.cuda.synchronize()

        figures["step_graph_ms"] = m.median_ms(replay, a.runs, warmup=10)
    print(json.dumps(figures))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
