#!/usr/bin/env python
"""Where a model step's GPU idles, and why: the host side of ``bench --model``'s ``idle_gaps``.

    python tools/model_idle.py out.json [gdn|kda] [ours,fla]        # a GPU

For each arm (a fresh model, as ``bench --model`` builds it; fla's arms with its refusal bypassed):
- step times with Python's cyclic garbage collector on and off (``gc.disable()``), alternating, and
  every collection that ran inside a timed step (generation, duration, when in the step);
- host time per phase (forward, loss, backward, optimizer: ``perf_counter`` with no sync) beside
  the GPU time of the whole step;
- one step under the profiler with CPU and CUDA activity: the longest GPU gaps, each with the CPU
  operations that ran while the GPU waited (name, duration, the innermost Python frames of ours
  or fla's), so that a gap names its host-side cause; and the step's GPU time by the CPU op that
  launched it (``device_time_by_op``: op, its autograd node or Python frames), which names the
  caller of every glue kernel (copies, adds, casts).
Not a record (the profiler slows the host): a diagnosis for docs/model.md.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def _frames(stack) -> list:
    keep = [f for f in (stack or []) if ("kernel_fun" in f or "/fla/" in f or "model.py" in f)]
    return keep[:4]


def device_time_by_op(evs, top: int = 40) -> list:
    """The profiled step's GPU time by the CPU operation that launched it: each op's own device time
    (its kernels, not its children's), grouped by op name and where it ran from (the autograd node
    of a backward op, or the innermost frames of ours, fla's or the model's for a forward op), so
    the glue kernels (copies, adds, casts) name their caller."""
    rows = {}
    for e in evs:
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if not us or e.device_type.name != "CPU":
            continue
        node, p = "", e.cpu_parent
        while p is not None:
            if p.name.startswith("autograd::engine::evaluate_function: "):
                node = p.name.split(": ", 1)[1]
                break
            p = p.cpu_parent
        where = node or " | ".join(_frames(getattr(e, "stack", None))[:3])
        r = rows.setdefault((e.name, where), {"op": e.name[:60], "from": where[:200], "calls": 0, "device_us": 0.0})
        r["calls"] += 1
        r["device_us"] += us
    out = sorted(rows.values(), key=lambda r: -r["device_us"])[:top]
    for r in out:
        r["device_us"] = round(r["device_us"], 1)
    return out


def diagnose(arm: str, cfg: dict, layer: str, init_state, tokens) -> dict:
    import torch
    import torch.nn.functional as F

    from kernel_fun.bench import model as M

    out = {"arm": arm}
    with M._arm_env(arm, layer):
        net, opt = M.arm_model(arm, cfg, init_state, layer, cfg["lr"])
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        phases = {}

        def step():
            t = [time.perf_counter()]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(inputs)
            t.append(time.perf_counter())
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
            opt.step()
            t.append(time.perf_counter())
            for name, a, b in zip(("forward", "loss", "backward", "optimizer"), t, t[1:]):
                phases.setdefault(name, []).append((b - a) * 1e3)
            return loss

        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        out["first_step_s"] = round(time.perf_counter() - t0, 1)
        for _ in range(4):
            step()
        torch.cuda.synchronize()
        phases.clear()

        collections = []
        state = {"t0": 0.0, "start": 0.0, "in_step": False}

        def cb(phase, info):
            if not state["in_step"]:
                return
            now = time.perf_counter()
            if phase == "start":
                state["start"] = now
            else:
                collections.append({"gen": info["generation"], "ms": round((now - state["start"]) * 1e3, 3),
                                    "at_ms": round((state["start"] - state["t0"]) * 1e3, 2),
                                    "collected": info["collected"]})

        gc.callbacks.append(cb)
        times = {"gc_on": [], "gc_off": []}
        try:
            for r in range(16):
                mode = "gc_on" if r % 2 == 0 else "gc_off"
                if mode == "gc_off":
                    gc.disable()
                torch.cuda.synchronize()
                state["t0"] = time.perf_counter()
                state["in_step"] = True
                step()
                torch.cuda.synchronize()
                state["in_step"] = False
                times[mode].append((time.perf_counter() - state["t0"]) * 1e3)
                gc.enable()
        finally:
            gc.callbacks.remove(cb)
            gc.enable()
        out["step_ms"] = {k: round(statistics.median(v), 3) for k, v in times.items()}
        out["step_ms_all"] = {k: [round(x, 2) for x in v] for k, v in times.items()}
        out["collections_in_timed_steps"] = collections
        out["host_ms_per_phase"] = {k: round(statistics.median(v), 3) for k, v in phases.items()}

        # where the forward's host time goes: cProfile of 5 forwards (cumulative time, ours, fla's
        # and Triton's functions), and any synchronizing torch call in a step (sync debug mode)
        import cProfile
        import io
        import pstats

        def forward_only():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                net(inputs)

        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            forward_only()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
        st.print_stats("kernel_fun|triton|fla|torch/nn|autograd", 45)
        out["forward_cprofile"] = buf.getvalue()
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
                torch.cuda.synchronize()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out["synchronizing_calls"] = sorted({f"{w.filename}:{w.lineno}: {str(w.message)[:80]}" for w in caught})[:20]

        # one step with CPU and CUDA activity: what the host did while the GPU waited
        from torch.autograd import DeviceType

        for _ in range(2):  # the first profile is dropped: the profiler's own first-use costs fall in it
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA], with_stack=True) as prof:
                step()
                torch.cuda.synchronize()
        evs = list(prof.events())
        out["device_time_by_op"] = device_time_by_op(evs)
        gpu = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs if e.device_type == DeviceType.CUDA)
        cpu = [e for e in evs if e.device_type == DeviceType.CPU]
        gaps, busy, prev = [], gpu[0][1], gpu[0][2]
        for s, e, n in gpu[1:]:
            if s > busy:
                gaps.append((s - busy, busy, s, prev, n))
            if e >= busy:
                busy, prev = e, n
        t_first = gpu[0][0]
        out["profiled"] = {"idle_ms": round(sum(g[0] for g in gaps) / 1e3, 3),
                           "span_ms": round((busy - t_first) / 1e3, 3), "gaps": []}
        for g, a, b, pa, nb in sorted(gaps, key=lambda x: -x[0])[:10]:
            inside = [e for e in cpu if e.time_range.end > a and e.time_range.start < b]
            inside.sort(key=lambda e: -(min(e.time_range.end, b) - max(e.time_range.start, a)))
            out["profiled"]["gaps"].append({
                "us": round(g, 1), "at_ms": round((a - t_first) / 1e3, 3), "after": pa[:70], "before": nb[:70],
                "cpu": [{"op": e.name[:60], "overlap_us": round(min(e.time_range.end, b) - max(e.time_range.start, a), 1),
                         "frames": _frames(getattr(e, "stack", None))} for e in inside[:8]]})
    return out


def main() -> int:
    import torch

    from kernel_fun.bench import model as M

    path = sys.argv[1]
    layer = sys.argv[2] if len(sys.argv) > 2 else "gdn"
    arms = (sys.argv[3] if len(sys.argv) > 3 else "ours,fla").split(",")
    cfg = M.parse({})
    init_state = {k: v.detach().clone() for k, v in M.build(cfg, layer).state_dict().items()}
    tokens = M.structured_tokens(cfg["B"], cfg["T"], cfg["vocab"], cfg["seed"]).cuda()
    M.prime_lazy_allocations(cfg["hidden"])
    res = {"layer": layer, "gc_threshold": gc.get_threshold(), "arms": []}
    for arm in arms:
        r = diagnose(arm, cfg, layer, init_state, tokens)
        res["arms"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("profiled", "forward_cprofile")}), flush=True)
        print(r["forward_cprofile"][:6000], flush=True)
        for d in r.get("device_time_by_op", [])[:30]:
            print(f"  {d['device_us']:9.1f} us {d['calls']:4d}x  {d['op'][:40]:40s} {d['from'][:150]}")
        for gp in r["profiled"]["gaps"][:6]:
            print(f"  gap {gp['us']:8.1f} us at {gp['at_ms']:7.2f} ms  {gp['after'][:40]} -> {gp['before'][:40]}")
            for c in gp["cpu"][:5]:
                print(f"      {c['overlap_us']:8.1f} us  {c['op']:40s} {' | '.join(c['frames'][:2])[:150]}")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
