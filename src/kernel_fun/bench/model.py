"""`kernel-fun bench --model kda|gdn|gdn_default`: the model-level A/B, the number users are judged by.

A small stack of fla's real layers (``KimiDeltaAttention`` at fla 0.6.0's defaults: hidden 2048,
16 heads, head_dim 128; ``GatedDeltaNet`` with 16 q/k heads and 32 value heads of 128; or
``GatedDeltaNet`` at fla's own defaults, 6 heads of K = 256 and V = 512) with
pre-norm residuals, an embedding and an LM head, trained for a few
steps in one process on one GPU, bf16 autocast, AdamW, fixed seed and the same initial weights
in every arm:

- ``ours``: ``kernel_fun.patch_fla()``;
- ``fla``: fla as installed (the reference of every comparison);
- ``disabled``: patched, with ``KERNEL_FUN_DISABLE=1`` (must equal ``fla`` bitwise);
- ``fla_ulp``: fla with the embedding perturbed by one bf16 ulp: the noise floor that ours'
  difference from fla is judged against (not zero).

Reported per arm: median step time after warmup, first-step time (compile + autotune; whether
Triton's on-disk cache was warm is recorded), peak memory, loss per step, step-0 gradient
difference from fla per parameter group, the loss comparison at the largest learning rate (the
configured one, or a half, a quarter or an eighth of it) at which fla's own curve has no bump
(``summary.loss_at_smooth_lr``: ours' and the noise floor's largest difference from fla there), launches of our kernels per family (the witness), a
per-kernel profile of one step (ours / fla's / torch GEMM / other), the host's own time to
enqueue a step and the GPU's idle time in it (``gpu_idle``: a host-bound step shows there), and,
for our arm, a cProfile of one step's host work.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

# layer kind -> (fla's class, its extra constructor arguments, the families it must engage)
LAYERS = {
    "kda": ("KimiDeltaAttention", {}, ("cconv", "kda", "gnorm")),
    # issue 17's GDN stack: 16 q/k heads of 128, 32 value heads of 128 (Qwen3-Next's grouping)
    "gdn": ("GatedDeltaNet", {"num_v_heads": 32, "expand_v": 1}, ("cconv", "gdn", "gnorm")),
    # fla's GatedDeltaNet as its config builds it: 6 heads of K = 256, values expanded 2x (V = 512)
    "gdn_default": ("GatedDeltaNet", {"expand_v": 2}, ("cconv", "gdn", "gnorm")),
}
# a layer kind's own heads and head size, where they are not DEFAULTS' (``--shape`` still overrides them)
LAYER_SHAPES = {"gdn_default": {"heads": 6, "head_dim": 256}}
DEFAULTS = dict(layers=4, hidden=2048, heads=16, head_dim=128, B=4, T=4096, vocab=8192, steps=12,
                warmup=3, lr=5e-4, seed=0)
# ours first: its first step then also tunes the fla stages our chain still calls, as a user's
# first step would (fla's arm finds those warm); a second run of the bench, with Triton's
# on-disk cache warm, gives both arms' first step on equal terms.
ARMS = ("ours", "fla", "disabled", "fla_ulp")
FAMILIES = ("cconv", "kda", "delta", "gnorm", "gdn")  # launch-counter prefixes of ours


def parse(overrides: dict, layer: str | None = None) -> dict:
    """The shape and schedule from ``--shape`` overrides over the layer kind's defaults; an unknown key
    is an error."""
    from .harness import UsageError

    cfg = dict(DEFAULTS, **LAYER_SHAPES.get(layer, {}))
    for key, value in overrides.items():
        if key not in cfg:
            raise UsageError(f"--model: unknown --shape key {key!r} (keys: {', '.join(cfg)})")
        try:
            cfg[key] = type(DEFAULTS[key])(value)
        except ValueError:
            raise UsageError(f"--model: {key}={value!r} is not a {type(DEFAULTS[key]).__name__}") from None
    return cfg


def structured_tokens(B: int, T: int, vocab: int, seed: int):
    """Tokens with learnable structure (so the loss falls): each sequence follows
    ``x[t+1] = (a * x[t] + c) mod vocab`` with its own (a, c), 10% of positions replaced by
    noise. [B, T+1] int64 on the GPU (inputs are [:, :-1], targets [:, 1:])."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(1, 8, (B, 1), generator=gen)
    c = torch.randint(0, vocab, (B, 1), generator=gen)
    x = torch.empty(B, T + 1, dtype=torch.int64)
    x[:, :1] = torch.randint(0, vocab, (B, 1), generator=gen)
    for t in range(T):
        x[:, t + 1: t + 2] = (a * x[:, t: t + 1] + c) % vocab
    noise = torch.rand(B, T + 1, generator=gen) < 0.1
    x[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=gen)
    return x


def build(cfg: dict, layer: str = "kda"):
    """The stack (fp32 parameters; the step runs under bf16 autocast)."""
    import torch
    import torch.nn as nn

    import fla.layers as fla_layers

    cls, extra, _ = LAYERS[layer]
    Layer = getattr(fla_layers, cls)

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.norm = nn.RMSNorm(cfg["hidden"], eps=1e-6)
            self.attn = Layer(hidden_size=cfg["hidden"], num_heads=cfg["heads"], head_dim=cfg["head_dim"],
                              layer_idx=i, **extra)

        def forward(self, x):
            return x + self.attn(self.norm(x))[0]

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], cfg["hidden"])
            self.blocks = nn.ModuleList(Block(i) for i in range(cfg["layers"]))
            self.norm = nn.RMSNorm(cfg["hidden"], eps=1e-6)
            self.head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    torch.manual_seed(cfg["seed"])
    return Stack().cuda()


def group_of(name: str) -> str:
    """The parameter group a gradient is reported under (the layer's parameter kind)."""
    parts = name.split(".")
    if parts[0] == "blocks":
        rest = parts[2:]
        if rest[0] == "attn":
            return rest[1] if rest[1] in ("A_log", "dt_bias") else rest[1]
        return "block_norm"
    return parts[0]


def perturb_one_ulp(w, seed: int, fmt=None):
    """``w`` moved by one ulp of ``fmt`` (default bf16; the values of ``w`` are ``fmt`` values, in any
    storage dtype) per element, random sign (in place, no grad)."""
    import torch

    gen = torch.Generator(device=w.device).manual_seed(seed)
    with torch.no_grad():
        _, e = torch.frexp(w)  # |w| in [2^(e-1), 2^e): ulp 2^(e-1) eps, 2^(e-8) for bf16's 7 mantissa bits
        ulp = torch.ldexp(torch.full_like(w, torch.finfo(fmt or torch.bfloat16).eps), e - 1)
        sign = torch.randint(0, 2, w.shape, generator=gen, device=w.device) * 2 - 1
        w.add_(ulp * sign)


def classify_kernel(name: str, ours: set, fla: set) -> str:
    # a Triton kernel's profiler row is its function's name, exactly
    low = name.lower()
    if name in ours:
        return "ours"
    if name in fla:
        return "fla"
    if any(s in low for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "wgmma")):
        return "torch_gemm"
    return "torch_other"


def _jit_names(prefix: str) -> set:
    """Names of the Triton kernels defined in loaded modules under ``prefix`` (a profiler row
    carries the kernel's Python function name). Autotuner and Heuristics wrap a JITFunction in
    ``.fn``, which wraps the Python function in ``.fn``: descend to the function. Wrappers of
    other packages count when a Triton object is on the way down (fla's ``CachedAutotuner``,
    which wraps its l2norm and conv kernels, is defined in ``fla.ops.utils.cache``)."""
    import sys

    names = set()
    for mname, mod in list(sys.modules.items()):
        if not mname.startswith(prefix) or mod is None:
            continue
        for obj in list(vars(mod).values()):
            fn, depth, triton_seen = obj, 0, False
            while hasattr(fn, "fn") and depth < 6:
                triton_seen = triton_seen or type(fn).__module__.startswith("triton")
                fn, depth = fn.fn, depth + 1
            name = getattr(fn, "__name__", None)
            if triton_seen and name:
                names.add(name)
    return names


def _profile_step(step) -> tuple[list, list]:
    """One profiled step: (rows ``(kernel, ms, calls)`` per kernel name, the device spans ``(start us,
    end us, kernel)``, for ``idle_gaps``). A first profiled step is run and dropped: the profiler's
    own first-use costs (CUPTI's activity buffers, each kernel's first sighting) fell in the first
    arm's profiled step, ours (the 2026-12-04 GDN record: ours' first 5 ms idled 1.29 ms against fla's
    0.32, with gaps before the embedding and the first layer norm, code both arms share, 2-3x fla's,
    and a 1 ms gap between two fills where session 15's CPU profile saw CUPTI's buffer request)."""
    import torch
    from torch.autograd import DeviceType

    for _ in range(2):  # the second profile is kept
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append((e.key, t / 1e3, e.count))
    spans = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
             if e.device_type == DeviceType.CUDA]
    return rows, spans


def idle_gaps(spans: list, top: int = 8, window_ms: float = 5.0, min_us: float = 10.0) -> dict:
    """Where the GPU waits inside a step, from its kernels' ``(start us, end us, name)`` spans (one
    stream): the idle time between the first kernel's start and the last one's end, that idle per
    ``window_ms`` of the timeline (which phase: the forward comes first), and the ``top`` longest
    gaps of at least ``min_us`` with the kernels on either side and their offset from the first
    kernel (a host-bound stretch shows as a run of gaps after short kernels)."""
    if not spans:
        return {"idle_ms": 0.0, "span_ms": 0.0, "idle_ms_per_window": [], "gaps": []}
    spans = sorted(spans)
    t0 = spans[0][0]
    gaps, busy_until, prev = [], spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > busy_until:
            gaps.append((start - busy_until, busy_until, prev, name))
        if end >= busy_until:
            busy_until, prev = end, name
    span = busy_until - t0
    windows = [0.0] * (int(span / (window_ms * 1e3)) + 1)
    for gap, at, _, _ in gaps:
        windows[int((at - t0) / (window_ms * 1e3))] += gap
    longest = sorted((g for g in gaps if g[0] >= min_us), key=lambda g: -g[0])[:top]
    return {"idle_ms": round(sum(g[0] for g in gaps) / 1e3, 3), "span_ms": round(span / 1e3, 3),
            "window_ms": window_ms, "idle_ms_per_window": [round(w / 1e3, 3) for w in windows],
            "gaps": [{"us": round(g, 1), "at_ms": round((at - t0) / 1e3, 3), "after": a[:80], "before": b[:80]}
                     for g, at, a, b in longest]}


def _triton_cache_entries() -> int:
    try:
        from triton import knobs

        root = knobs.cache.dir
    except Exception:
        root = os.path.join(os.path.expanduser("~"), ".triton", "cache")
    n = 0
    for _, _, files in os.walk(root):
        n += sum(f.endswith(".autotune.json") for f in files)
    return n


@contextlib.contextmanager
def _arm_env(arm: str, layer: str):
    import kernel_fun

    saved = os.environ.get("KERNEL_FUN_DISABLE")
    bypass = contextlib.nullcontext()
    if LAYERS[layer][0] == "GatedDeltaNet" and arm != "ours":
        # fla refuses GDN's backward on Hopper with Triton 3.4-3.7.0 (fla #640); its arms run with
        # the refusal bypassed, as its op bench does: fla's speed, not a usable result
        from .gdn import fla_refusal_bypassed

        bypass = fla_refusal_bypassed()
    if arm in ("ours", "disabled"):
        kernel_fun.patch_fla()
    if arm == "disabled":
        os.environ["KERNEL_FUN_DISABLE"] = "1"
    try:
        with bypass:
            yield
    finally:
        kernel_fun.unpatch_fla()
        if saved is None:
            os.environ.pop("KERNEL_FUN_DISABLE", None)
        else:
            os.environ["KERNEL_FUN_DISABLE"] = saved


def prime_lazy_allocations(hidden: int) -> float:
    """Make the process-wide allocations that the first matmul forward and backward make (the
    cuBLAS and cuBLASLt workspaces of the main thread and of autograd's device thread) before any
    arm runs, so that they fall in every arm's baseline and not in the first arm's peak. Without
    this the first arm (ours) carried them: in the 2026-12-02 GDN record ours held 64.0 MB more
    than fla at every phase of a step. Returns the MB they took."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    lin = torch.nn.Linear(hidden, hidden, device="cuda")
    x = torch.randn(256, hidden, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x)
    y.float().square().mean().backward()
    del lin, x, y
    torch.cuda.synchronize()
    return round((torch.cuda.memory_allocated() - before) / 2**20, 1)


def _host_profile(step, top: int = 30) -> str:
    import cProfile
    import io
    import pstats

    import torch

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def arm_model(arm: str, cfg: dict, init_state: dict, layer: str, lr: float):
    """An arm's model (the shared initial weights; the embedding one bf16 ulp off for ``fla_ulp``)
    and its AdamW."""
    import torch

    model = build(cfg, layer)
    model.load_state_dict(init_state)
    if arm == "fla_ulp":
        perturb_one_ulp(model.embed.weight, cfg["seed"] + 1)
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def lm_loss(model, inputs, targets):
    """The next-token cross entropy of a step, the forward under bf16 autocast."""
    import torch
    import torch.nn.functional as F

    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(inputs)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def run_arm(arm: str, cfg: dict, init_state: dict, tokens, layer: str) -> dict:
    import torch

    from .._common.witness import launch_counts

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()  # other arms' models stay alive for the interleaved timing
    torch.cuda.reset_peak_memory_stats()
    model, opt = arm_model(arm, cfg, init_state, layer, cfg["lr"])
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    out = {"arm": arm, "loss": [], "step_ms": [], "host_ms": []}

    def mark(phases, name):
        # phases: {name: (MB held at the phase's end, MB peak within it)} over ``base``
        if phases is not None:
            torch.cuda.synchronize()
            phases[name] = (round((torch.cuda.memory_allocated() - base) / 2**20, 1),
                            round((torch.cuda.max_memory_allocated() - base) / 2**20, 1))
            torch.cuda.reset_peak_memory_stats()

    def step(record_grads=False, phases=None):
        opt.zero_grad(set_to_none=True)
        mark(phases, "start")
        loss = lm_loss(model, inputs, targets)
        mark(phases, "forward")  # held: what the graph saved for the backward
        loss.backward()
        mark(phases, "backward")
        grads = None
        if record_grads:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        mark(phases, "optimizer")
        return loss, grads

    with _arm_env(arm, layer):
        before = launch_counts()
        for i in range(cfg["steps"]):
            t0 = time.perf_counter()
            loss, grads = step(record_grads=(i == 0))
            # the host has enqueued the step (nothing in it waits for the GPU): from an idle GPU,
            # this is the host's own time for a step, the floor of the step time it sets
            out["host_ms"].append((time.perf_counter() - t0) * 1e3)
            out["loss"].append(float(loss.detach()))  # a sync: the step is done
            torch.cuda.synchronize()
            out["step_ms"].append((time.perf_counter() - t0) * 1e3)
            if i == 0:
                out["grads0"] = grads
                # step 0 compiles and autotunes (its trial launches, and any tensor an autotuner
                # resets or restores, are transients no later step has): its peak kept apart
                first = torch.cuda.max_memory_allocated() - base
                torch.cuda.reset_peak_memory_stats()
        steady = torch.cuda.max_memory_allocated() - base
        out["peak_mb"] = round(max(first, steady) / 2**20, 1)  # this arm's own, every step
        out["peak_first_step_mb"] = round(first / 2**20, 1)
        out["peak_steady_mb"] = round(steady / 2**20, 1)  # steps after the first
        # one more step, phase by phase (where a peak difference between arms comes from)
        phases: dict = {}
        step(phases=phases)
        out["memory_by_phase_mb"] = {k: {"held": h, "peak": pk} for k, (h, pk) in phases.items()}
        after = launch_counts()
        launched = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        out["launches"] = {fam: sum(v for k, v in launched.items() if k.startswith(fam + "."))
                           for fam in FAMILIES}
        out["profile"], spans = _profile_step(lambda: step())
        out["idle_gaps"] = idle_gaps(spans)
        if arm == "ours":  # where that host time goes (cProfile of one step, own time per function)
            out["host_profile"] = _host_profile(step)
    out["step"] = step  # kept for the interleaved timing of the ours and fla arms
    return out


# Issue 16: "choose a learning rate at which fla's own loss curve is smooth" and judge ours' loss
# against the noise floor there. A step whose loss rises more than this fraction over the step
# before is a bump; fla's GDN stack at lr 5e-4 has one at step 2 in every record (6.66 -> 10.60).
LOSS_RISE = 0.01
LR_HALVINGS = 3  # lr, lr/2, lr/4, lr/8: the largest of them at which fla's curve has no bump


def loss_bumps(losses: list) -> list:
    """The steps whose loss rose more than ``LOSS_RISE`` over the step before."""
    return [i for i in range(1, len(losses)) if losses[i] > losses[i - 1] * (1 + LOSS_RISE)]


def loss_curve(arm: str, cfg: dict, init_state: dict, tokens, layer: str, lr: float) -> list:
    """An arm's loss per step at learning rate ``lr``: ``run_arm``'s training loop alone (same
    weights, tokens, perturbation and patching; no timing, profile or memory marks)."""
    import torch

    model, opt = arm_model(arm, cfg, init_state, layer, lr)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    losses = []
    with _arm_env(arm, layer):
        for _ in range(cfg["steps"]):
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(model, inputs, targets)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    del model, opt
    torch.cuda.empty_cache()
    return losses


def loss_at_smooth_lr(curves: dict, lr: float, curve_at) -> dict:
    """The loss comparison at the largest of lr, lr/2, ... (``LR_HALVINGS`` halvings) at which fla's
    own curve has no bump: ``curves`` holds the arms' losses at ``lr`` (``fla``, ``ours``, ``fla_ulp``),
    ``curve_at(arm, lr)`` runs an arm at another. Ours' largest difference from fla is reported beside
    the noise floor's (``fla_ulp``'s) at that rate; ``smooth`` is False where every rate tried bumped
    (the last one's curves are then reported)."""
    bumpy = {}
    for _ in range(LR_HALVINGS):
        bumps = loss_bumps(curves["fla"])
        if not bumps:
            break
        bumpy[lr] = bumps
        lr /= 2
        curves = {arm: curve_at(arm, lr) for arm in ("fla", "ours", "fla_ulp")}
    f = curves["fla"]
    return {"lr": lr, "smooth": not loss_bumps(f), "fla_bumps_at": {f"{k:g}": v for k, v in bumpy.items()},
            "loss": {arm: [round(x, 6) for x in c] for arm, c in curves.items()},
            "max_loss_diff": {arm: round(max(abs(x - y) for x, y in zip(curves[arm], f)), 6)
                              for arm in ("ours", "fla_ulp")}}


def interleaved_step_ms(arms: dict, layer: str, rounds: int = 6, steps: int = 3) -> dict:
    """Step time of ``ours`` and ``fla`` timed in alternation (ours, fla, ours, ...), so a drift
    of the machine (clocks, temperature, allocator state) falls on both arms alike."""
    import torch

    times = {"ours": [], "fla": []}
    for _ in range(rounds):
        for arm in times:
            with _arm_env(arm, layer):
                for _ in range(steps):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    arms[arm]["step"]()
                    torch.cuda.synchronize()
                    times[arm].append((time.perf_counter() - t0) * 1e3)
    return {arm: round(statistics.median(t), 3) for arm, t in times.items()}


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def grad_diffs(grads: dict, ref: dict) -> dict:
    """Relative RMS difference per parameter group (all of a group's tensors together)."""
    import torch

    groups: dict = {}
    for name, g in grads.items():
        groups.setdefault(group_of(name), []).append((g.flatten(), ref[name].flatten()))
    return {grp: round(_rel(torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])), 6)
            for grp, pairs in sorted(groups.items())}


def summarize_profile(rows: list, ours: set, fla: set) -> dict:
    by = {"ours": 0.0, "fla": 0.0, "torch_gemm": 0.0, "torch_other": 0.0}
    kernels = []
    for name, ms, count in rows:
        kind = classify_kernel(name, ours, fla)
        by[kind] += ms
        kernels.append({"kernel": name[:120], "kind": kind, "ms": round(ms, 4), "calls": count})
    kernels.sort(key=lambda r: -r["ms"])
    return {"by_kind_ms": {k: round(v, 3) for k, v in by.items()}, "kernels": kernels}


def gpu_idle_ms(arm: dict) -> dict:
    """How much of an arm's median step the GPU spends without a kernel: the median step less the
    profiled step's kernel time (one stream, so the kernels do not overlap), beside the host's
    own time to enqueue a step (``host_ms``: a step at or near it is host-bound). Where the host,
    not the GPU, sets the pace (launch and Python costs), this is what a host cut can win."""
    busy = sum(arm["profile"]["by_kind_ms"].values())
    return {"step_ms": arm["median_step_ms"], "kernels_ms": round(busy, 3),
            "idle_ms": round(arm["median_step_ms"] - busy, 3), "host_ms": arm.get("median_host_ms")}


def main(layer: str, overrides: dict, json_path: str | None) -> int:
    import torch

    from . import harness

    if layer not in LAYERS:
        from .harness import UsageError

        raise UsageError(f"--model: unknown layer {layer!r} (layers: {', '.join(LAYERS)})")
    cfg = parse(overrides, layer)
    if not torch.cuda.is_available():
        print("kernel-fun bench --model: the model A/B needs a CUDA GPU; none here.")
        return 2
    cache_entries = _triton_cache_entries()
    print(f"model A/B: {cfg['layers']} x fla {LAYERS[layer][0]}, hidden {cfg['hidden']}, {cfg['heads']} heads x "
          f"{cfg['head_dim']}, B={cfg['B']} T={cfg['T']}, {cfg['steps']} steps, lr {cfg['lr']} "
          f"(on-disk autotune entries at start: {cache_entries})", flush=True)
    init_state = {k: v.detach().clone() for k, v in build(cfg, layer).state_dict().items()}
    tokens = structured_tokens(cfg["B"], cfg["T"], cfg["vocab"], cfg["seed"]).cuda()
    lazy_mb = prime_lazy_allocations(cfg["hidden"])
    print(f"  lazy allocations before the first arm (cuBLAS/cuBLASLt workspaces): {lazy_mb} MB", flush=True)
    arms = {}
    for arm in ARMS:
        t0 = time.perf_counter()
        arms[arm] = run_arm(arm, cfg, init_state, tokens, layer)
        a = arms[arm]
        timed = a["step_ms"][cfg["warmup"]:]
        a["median_step_ms"] = round(statistics.median(timed), 3)
        a["median_host_ms"] = round(statistics.median(a["host_ms"][cfg["warmup"]:]), 3)
        a["first_step_s"] = round(a["step_ms"][0] / 1e3, 2)
        print(f"  {arm:9s} median step {a['median_step_ms']:9.2f} ms (host {a['median_host_ms']:.2f})  "
              f"first step {a['first_step_s']:7.2f} s  "
              f"peak {a['peak_mb']:9.1f} MB  launches {a['launches']}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    inter = interleaved_step_ms(arms, layer)
    print(f"  interleaved (6 rounds x 3 steps each): ours {inter['ours']} ms, fla {inter['fla']} ms", flush=True)
    for arm in ARMS:
        arms[arm].pop("step")
    torch.cuda.empty_cache()
    ours_names, fla_names = _jit_names("kernel_fun"), _jit_names("fla")
    ref = arms["fla"]
    for arm in ARMS:
        a = arms[arm]
        a["grad_rel_diff_vs_fla"] = grad_diffs(a.pop("grads0"), ref["grads0"]) if arm != "fla" else {}
        a["loss_abs_diff_vs_fla"] = [round(abs(x - y), 6) for x, y in zip(a["loss"], ref["loss"])]
        a["profile"] = summarize_profile(a["profile"], ours_names, fla_names)
    ref.pop("grads0")
    bitwise = arms["disabled"]["loss"] == ref["loss"] and all(
        v == 0 for v in arms["disabled"]["grad_rel_diff_vs_fla"].values())
    o, f = arms["ours"], ref
    replaced_ours = o["profile"]["by_kind_ms"]["ours"] + o["profile"]["by_kind_ms"]["fla"]
    replaced_fla = f["profile"]["by_kind_ms"]["fla"]
    summary = {
        "step_ms_interleaved": inter,
        "step_speedup": round(inter["fla"] / inter["ours"], 3),
        "step_speedup_per_arm_runs": round(f["median_step_ms"] / o["median_step_ms"], 3),
        "replaced_kernels_speedup": round(replaced_fla / replaced_ours, 3) if replaced_ours else None,
        "replaced_kernels_ms": {"fla": round(replaced_fla, 3), "ours": round(replaced_ours, 3)},
        "peak_mb": {"fla": f["peak_mb"], "ours": o["peak_mb"]},
        "peak_steady_mb": {"fla": f.get("peak_steady_mb"), "ours": o.get("peak_steady_mb")},
        "memory_by_phase_mb": {"fla": f.get("memory_by_phase_mb"), "ours": o.get("memory_by_phase_mb")},
        "first_step_s": {"fla": f["first_step_s"], "ours": o["first_step_s"]},
        "gpu_idle": {"fla": gpu_idle_ms(f), "ours": gpu_idle_ms(o)},
        "disabled_equals_fla_bitwise": bitwise,
        "engaged": {fam: n > 0 for fam, n in o["launches"].items()},
        "grad_diff_over_noise_floor": {
            g: round(o["grad_rel_diff_vs_fla"][g] / max(arms["fla_ulp"]["grad_rel_diff_vs_fla"][g], 1e-12), 2)
            for g in o["grad_rel_diff_vs_fla"]},
        "max_loss_diff": {"ours": max(o["loss_abs_diff_vs_fla"]),
                          "fla_ulp": max(arms["fla_ulp"]["loss_abs_diff_vs_fla"])},
    }
    try:  # extra training runs after the measured ones: a failure here must not cost the record
        smooth = loss_at_smooth_lr({arm: arms[arm]["loss"] for arm in ("fla", "ours", "fla_ulp")}, cfg["lr"],
                                   lambda arm, lr: loss_curve(arm, cfg, init_state, tokens, layer, lr))
        print(f"loss at lr {smooth['lr']:g} (fla's curve {'smooth' if smooth['smooth'] else 'still bumpy'}; bumps "
              f"at {smooth['fla_bumps_at'] or 'none'}): max |ours - fla| {smooth['max_loss_diff']['ours']}, noise "
              f"floor {smooth['max_loss_diff']['fla_ulp']}", flush=True)
    except Exception as exc:  # noqa: BLE001
        smooth = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"loss at a smooth lr: not measured ({smooth['error']})", flush=True)
    summary["loss_at_smooth_lr"] = smooth
    print(f"step speedup {summary['step_speedup']}x; replaced kernels {summary['replaced_kernels_ms']} ms "
          f"({summary['replaced_kernels_speedup']}x); peak {summary['peak_mb']} MB; disabled == fla bitwise: "
          f"{bitwise}; engaged {summary['engaged']}", flush=True)
    print(f"GPU idle in the median step (step less its kernels): {summary['gpu_idle']}", flush=True)
    for arm in ("ours", "fla"):  # where in the profiled step (arms[arm]["idle_gaps"] has the longest gaps)
        ig = arms[arm]["idle_gaps"]
        print(f"  {arm} idle between its first and last kernel {ig['idle_ms']} ms of {ig['span_ms']}, per "
              f"{ig['window_ms']} ms: {ig['idle_ms_per_window']}", flush=True)
    print(f"loss fla    {[round(x, 4) for x in f['loss']]}", flush=True)
    print(f"loss ours   {[round(x, 4) for x in o['loss']]}", flush=True)
    print(f"step-0 grad diff / noise floor per group: {summary['grad_diff_over_noise_floor']}", flush=True)
    rows = [{"family": "model", "case": f"{layer}_x{cfg['layers']}", "shape": cfg, "direction": "step",
             "ours_ms": inter["ours"], "fla_ms": inter["fla"], "speedup": summary["step_speedup"],
             "engaged": all(summary["engaged"][fam] for fam in LAYERS[layer][2])}]
    rec = harness.record(rows, {}, extra={"model": {"layer": LAYERS[layer][0], "layer_args": LAYERS[layer][1],
                                                    "fla_backward_refusal_bypassed": LAYERS[layer][0] == "GatedDeltaNet",
                                                    "config": cfg, "autotune_cache_entries_at_start": cache_entries,
                                                    "lazy_allocations_mb": lazy_mb,
                                                    "summary": summary, "arms": arms}})
    harness.write_record(rec, json_path)
    return 0 if rows[0]["engaged"] and bitwise else 3
