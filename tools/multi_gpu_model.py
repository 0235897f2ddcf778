"""The model A/B under torch.distributed: DDP and FSDP2 (``fully_shard``) of the patched stack.

    python tools/multi_gpu_model.py --layer kda                     # both modes, 20 steps, 2 GPUs
    python tools/multi_gpu_model.py --layer gdn --mode fsdp --shape T=2048 --json out.json

Two processes (``torch.multiprocessing.spawn``), one GPU each (``torch.cuda.set_device(rank)``),
NCCL; the stack, tokens, optimizer and arms are ``kernel_fun.bench.model``'s (fla's real layers,
bf16 autocast, AdamW, fixed seed), each rank on its own ``B`` sequences of one token stream
(global batch ``B * world``). Per mode, arms run one after another on the same initial weights:

- ``ours``: ``kernel_fun.patch_fla()`` (first, so its first step also tunes the fla stages our
  chain still calls, as a user's first step would);
- ``fla``: fla as installed, the reference;
- ``fla_ulp``: fla with the embedding moved one bf16 ulp: the noise floor, as in the
  single-GPU A/B (ours' step-0 gradient difference from fla per parameter group is reported
  over fla_ulp's; <= 1 is within the floor).

Reported per mode and arm: loss per step (averaged over ranks), step time (median after
``warmup`` steps of the slowest rank's step, synchronized only around the timing), first-step
time, the families seen launching on every rank (the witness), step-0 gradient differences
(DDP: the all-reduced ``.grad``; FSDP2: ``.grad.full_tensor()``). Rank 0 writes one JSON record
(``bench/records/<day>-<gpu>-x2-<layer>-<sha>.json`` unless ``--json``). Every collective has a
timeout and the parent a deadline: a hang fails the run instead of holding the machine.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time

ARMS = ("ours", "fla", "fla_ulp")
MODES = ("ddp", "fsdp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _wrap(model, mode: str, rank: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    if mode == "ddp":
        return DDP(model, device_ids=[rank])
    fully_shard = _fully_shard()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _grads(raw, mode: str) -> dict:
    """Step-0 gradients, whole (FSDP2's are sharded DTensors: all-gathered on every rank)."""
    out = {}
    for name, p in raw.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if mode == "fsdp" else p.grad
        out[name] = g.detach().float().cpu()
    return out


def run_arm(rank: int, world: int, mode: str, arm: str, cfg: dict, init_state: dict, tokens, layer: str) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from kernel_fun._common.witness import launch_counts
    from kernel_fun.bench import model as M

    raw = M.build(cfg, layer)
    raw.load_state_dict(init_state)
    if arm == "fla_ulp":
        M.perturb_one_ulp(raw.embed.weight, cfg["seed"] + 1)  # same seed: the same move on every rank
    net = _wrap(raw, mode, rank)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg["lr"], weight_decay=0.01)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    losses, step_ms, grads0 = [], [], None
    with M._arm_env(arm, layer):
        before = launch_counts()
        for i in range(cfg["steps"]):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(inputs)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
            if i == 0:
                grads0 = _grads(raw, mode)
            opt.step()
            torch.cuda.synchronize()
            step_ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.detach())
        after = launch_counts()
    launched = {fam: sum(n - before.get(k, 0) for k, n in after.items() if k.startswith(fam + "."))
                for fam in M.FAMILIES}
    loss_t = torch.stack(losses)
    dist.all_reduce(loss_t, op=dist.ReduceOp.AVG)
    ms = torch.tensor(step_ms, device=loss_t.device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
    fams = torch.tensor([launched[f] > 0 for f in M.FAMILIES], device=loss_t.device, dtype=torch.int32)
    dist.all_reduce(fams, op=dist.ReduceOp.MIN)  # engaged on every rank
    ms = ms.tolist()
    out = {"arm": arm, "loss": [round(x, 6) for x in loss_t.tolist()], "step_ms": [round(x, 3) for x in ms],
           "median_step_ms": round(statistics.median(ms[cfg["warmup"]:]), 3), "first_step_s": round(ms[0] / 1e3, 2),
           "engaged_every_rank": {f: bool(v) for f, v in zip(M.FAMILIES, fams.tolist())},
           "launches_rank0": launched, "grads0": grads0}
    del net, raw, opt
    torch.cuda.empty_cache()
    return out


def _worker(rank: int, world: int, port: int, layer: str, modes: list, overrides: dict, json_path, timeout_s: int):
    import torch
    import torch.distributed as dist

    from kernel_fun.bench import model as M

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        cfg = M.parse(overrides)
        init_state = {k: v.detach().clone() for k, v in M.build(cfg, layer).state_dict().items()}
        tokens = M.structured_tokens(cfg["B"] * world, cfg["T"], cfg["vocab"], cfg["seed"])
        tokens = tokens[rank * cfg["B"]:(rank + 1) * cfg["B"]].cuda()
        results = {}
        for mode in modes:
            arms = {}
            for arm in ARMS:
                t0 = time.perf_counter()
                arms[arm] = run_arm(rank, world, mode, arm, cfg, init_state, tokens, layer)
                if rank == 0:
                    a = arms[arm]
                    print(f"  {mode:4s} {arm:8s} median step {a['median_step_ms']:9.2f} ms  first step "
                          f"{a['first_step_s']:7.2f} s  engaged {a['engaged_every_rank']}  "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if rank == 0:
                results[mode] = _summarize(arms, layer)
        if rank == 0:
            _write(results, cfg, layer, world, json_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _summarize(arms: dict, layer: str) -> dict:
    from kernel_fun.bench import model as M

    ref = arms["fla"]
    for arm in ARMS:
        a = arms[arm]
        a["grad_rel_diff_vs_fla"] = M.grad_diffs(a["grads0"], ref["grads0"]) if arm != "fla" else {}
        a["loss_abs_diff_vs_fla"] = [round(abs(x - y), 6) for x, y in zip(a["loss"], ref["loss"])]
    for a in arms.values():
        a.pop("grads0")
    o, u = arms["ours"], arms["fla_ulp"]
    floor = {g: round(o["grad_rel_diff_vs_fla"][g] / max(u["grad_rel_diff_vs_fla"][g], 1e-12), 2)
             for g in o["grad_rel_diff_vs_fla"]}
    summary = {
        "step_ms": {arm: arms[arm]["median_step_ms"] for arm in ARMS},
        "step_speedup": round(ref["median_step_ms"] / o["median_step_ms"], 3),
        "engaged": all(o["engaged_every_rank"][f] for f in M.LAYERS[layer][2]),
        "grad_diff_over_noise_floor": floor,
        "within_noise_floor": all(v <= 1 for v in floor.values()),
        "max_loss_diff": {"ours": max(o["loss_abs_diff_vs_fla"]), "fla_ulp": max(u["loss_abs_diff_vs_fla"])},
    }
    print(f"  loss fla  {[round(x, 4) for x in ref['loss']]}\n  loss ours {[round(x, 4) for x in o['loss']]}\n"
          f"  step-0 grad diff / noise floor: {floor}\n  summary {summary['step_ms']} ms, "
          f"speedup {summary['step_speedup']}x, engaged {summary['engaged']}", flush=True)
    return {"summary": summary, "arms": arms}


def _write(results: dict, cfg: dict, layer: str, world: int, json_path) -> None:
    from kernel_fun.bench import harness
    from kernel_fun.bench import model as M

    rows = [{"family": "model", "case": f"{layer}_x{cfg['layers']}_{mode}_x{world}", "shape": cfg, "direction": "step",
             "ours_ms": r["summary"]["step_ms"]["ours"], "fla_ms": r["summary"]["step_ms"]["fla"],
             "speedup": r["summary"]["step_speedup"], "engaged": r["summary"]["engaged"]}
            for mode, r in results.items()]
    rec = harness.record(rows, {}, extra={"multi_gpu": {
        "world": world, "backend": "nccl", "layer": M.LAYERS[layer][0], "layer_args": M.LAYERS[layer][1],
        "fla_backward_refusal_bypassed": layer == "gdn", "config": cfg, "modes": results}})
    if json_path is None:
        root = os.environ.get("KERNEL_FUN_RECORDS", os.path.join(os.getcwd(), "bench", "records"))
        gpu = rec["gpu"].replace("NVIDIA ", "").replace(" ", "-").lower()
        json_path = os.path.join(root, f"{rec['date'][:10]}-{gpu}-x{world}-{layer}-{rec['git_sha']}.json")
    harness.write_record(rec, json_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layer", choices=("kda", "gdn"), default="kda")
    ap.add_argument("--mode", choices=MODES + ("both",), default="both")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--shape", action="append", default=[], metavar="KEY=VALUE",
                    help="kernel_fun.bench.model's keys (layers, hidden, heads, head_dim, B, T, vocab, warmup, lr, seed)")
    ap.add_argument("--json")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for the whole run (and each collective)")
    args = ap.parse_args(argv)

    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.world:
        print(f"needs {args.world} CUDA devices, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    overrides = dict(kv.split("=", 1) for kv in args.shape)
    overrides["steps"] = str(args.steps)
    modes = list(MODES) if args.mode == "both" else [args.mode]
    print(f"{args.world} x {torch.cuda.get_device_name(0)}: {args.layer}, modes {modes}, arms {ARMS}", flush=True)
    ctx = mp.spawn(_worker, args=(args.world, _free_port(), args.layer, modes, overrides, args.json, args.timeout),
                   nprocs=args.world, join=False)
    deadline = time.monotonic() + args.timeout
    try:
        while not ctx.join(timeout=10):
            if time.monotonic() > deadline:
                print(f"ranks still running after {args.timeout} s: killed", file=sys.stderr)
                return 124
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
