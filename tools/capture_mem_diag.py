#!/usr/bin/env python
"""What the GDN chain's memory does after a CUDA graph capture: the steps of
``tests/gdn/test_chain_gpu.py::test_graph_capture_memory_aliasing_stream_determinism``, then
``memory_allocated`` after each of N eager steps (a leak grows each step; a one-off settles), and
the live blocks made after the baseline with the Python frames that allocated them
(``torch.cuda.memory._record_memory_history``).

    python tools/capture_mem_diag.py [N] [out.json]       # a GPU
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gdn"))
_spec = importlib.util.spec_from_file_location("gdn_conftest", os.path.join(ROOT, "tests", "gdn", "conftest.py"))
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
import test_chain_gpu as T  # noqa: E402


def trace(n: int, out=None):
    t, do, _, flags = T._case("layer_grouped")
    flags = dict(flags, output_final_state=False)
    for _ in range(3):
        T._step(t, do, flags)
    s2 = torch.cuda.Stream()
    s2.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s2):
        for _ in range(2):
            T._step(t, do, flags)
    torch.cuda.current_stream().wait_stream(s2)
    capture = os.environ.get("DIAG_CAPTURE", "1") == "1"
    if capture:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = T._step(t, do, flags)
        graph.replay()
        torch.cuda.synchronize()
        del graph, static
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    per_step = []
    for _ in range(n):
        T._step(t, do, flags)
        torch.cuda.synchronize()
        per_step.append(torch.cuda.memory_allocated() - base)
    print(f"capture={capture} base {base} B; after each step (B over base): {per_step}", flush=True)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live = []
    for seg in snap["segments"]:
        for blk in seg["blocks"]:
            if blk["state"] != "active_allocated":
                continue
            frames = blk.get("frames") or []
            if not frames:
                continue  # allocated before the recording: part of the baseline
            keep = [f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in frames
                    if f["filename"].endswith(".py")][:8]
            live.append({"size": blk["size"], "stream": seg.get("stream"), "frames": keep})
    live.sort(key=lambda r: -r["size"])
    print(f"{len(live)} live blocks allocated after the baseline, {sum(r['size'] for r in live)} B:", flush=True)
    for r in live[:20]:
        print(f"  {r['size']:>10} B stream {r['stream']}: " + " <- ".join(r["frames"]), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"capture": capture, "base": base, "per_step": per_step, "live": live[:50]}, f, indent=1)


if __name__ == "__main__":
    trace(int(sys.argv[1]) if len(sys.argv) > 1 else 50, sys.argv[2] if len(sys.argv) > 2 else None)
