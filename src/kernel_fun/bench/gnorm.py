"""gnorm benchmark cases (the layers' output-norm shapes by default) and its interpreted check.

Rows are x, g ``[B, T, HV, V]`` bf16 as the layers call ``o_norm(o, g)``, weight fp32 (the
module's parameter), no bias. Bytes per element (bf16): fwd reads x, g and writes y (6 B);
bwd reads x, g, dy and writes dx, dg (10 B); rstd (4 B per row) and dw are not counted.
"""
from __future__ import annotations

from .harness import Case, Direction

# N = 16 * 8192 * 16 = 2,097,152 rows: the shapes of shared/baselines/h200-2026-11-30.md.
PROD = dict(B=16, T=8192, HV=16)


KERNELS = {
    "gnorm.fwd": "the forward: y, rstd (and h)",
    "gnorm.bwd": "the persistent backward: dx, dg and the dw/db partials",
    "gnorm.dw_reduce": "the fixed-order dw/db reduction",
}
# `bench --stages gnorm`: the reduction has one fixed config and runs inside the backward's probe.
STAGED_WITH = {"gnorm.dw_reduce": "gnorm.bwd"}


def _case(name, B, T, HV, V, activation, note=""):
    import torch

    from .. import gnorm
    from .._common.compat import fla_symbol

    fla_fn = fla_symbol("fla.modules.norm.fused_norm_gate", "rms_norm_gated")
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (B, T, HV, V)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    g = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = (1 + 0.1 * torch.randn(V, device="cuda", generator=gen)).requires_grad_()
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    kw = dict(activation=activation, eps=1e-5)

    def ours_fwd():
        return gnorm.rms_norm_gated(x, g, w, None, **kw)

    def fla_fwd():
        return fla_fn(x, g, w, None, **kw)

    y_ours, y_fla = ours_fwd(), fla_fwd()
    torch.autograd.grad(y_ours, (x, g, w), dy, retain_graph=True)  # autotune both stages now
    from ..gnorm._kernels import bwd, fwd

    tuned_fwd, tuned_bwd = _tuning(fwd.gnorm_fwd_kernel), _tuning(bwd.gnorm_bwd_kernel)
    n, elt = x.numel(), x.element_size()
    dirs = [
        Direction("fwd", ours_fwd, fla_fwd, nbytes=3 * n * elt, extra={"ours_autotune": tuned_fwd}),
        Direction("bwd", lambda: torch.autograd.grad(y_ours, (x, g, w), dy, retain_graph=True),
                  lambda: torch.autograd.grad(y_fla, (x, g, w), dy, retain_graph=True), nbytes=5 * n * elt,
                  extra={"ours_autotune": tuned_bwd}),
        Direction("fwdbwd", lambda: torch.autograd.grad(ours_fwd(), (x, g, w), dy),
                  lambda: torch.autograd.grad(fla_fwd(), (x, g, w), dy), nbytes=8 * n * elt),
    ]
    info = dict(B=B, T=T, HV=HV, V=V, N=B * T * HV, dtype="bfloat16", weight_dtype="float32",
                activation=activation, eps=1e-5)
    return Case("gnorm", name, info, dirs, witness=("gnorm.",), note=note)


def _tuning(kernel) -> dict:
    """The autotuner's pick for the last key it tuned and, when it timed them in this process,
    every config's time (ms, its median): the record keeps what the next pruning needs."""
    timings = getattr(kernel, "configs_timings", None) or {}

    def ms(v):
        return round(float(v[0] if isinstance(v, (list, tuple)) else v), 4)

    return {"best": str(getattr(kernel, "best_config", None)),
            "timings_ms": {str(c): ms(v) for c, v in timings.items()}}


def cases(overrides: dict | None = None):
    """(name, build) pairs: the two layer shapes and a latency case, or one ``custom`` case
    for ``--shape`` (keys B, T, HV, V, activation)."""
    if overrides:
        p = dict(PROD, V=256, activation="sigmoid")
        p.update(overrides)
        return [("custom", lambda: _case("custom", int(p["B"]), int(p["T"]), int(p["HV"]), int(p["V"]),
                                         str(p["activation"])))]
    return [
        ("kda_v256_sigmoid", lambda: _case("kda_v256_sigmoid", V=256, activation="sigmoid", **PROD)),
        ("gdn_v128_swish", lambda: _case("gdn_v128_swish", V=128, activation="swish", **PROD)),
        ("latency_n4096_v256", lambda: _case("latency_n4096_v256", 1, 256, 16, 256, "sigmoid")),
    ]


# The stage probes' shapes: rows [N, V] at a masked width in fp32 and, for `bench --stages gnorm`
# on a GPU, the KDA layer's output norm (N = 16 * 8192 * 16 rows, V = 256, bf16, sigmoid).
CHECK_SHAPE = dict(N=40, V=96, dtype="float32", activation="sigmoid")
STAGE_SHAPES = {"cpu": CHECK_SHAPE, "cuda": dict(N=16 * 8192 * 16, V=256, dtype="bfloat16", activation="sigmoid")}


def probes(device: str, shape: dict | None = None) -> list:
    """gnorm's forward and backward launchers at the layers' call (weight, no bias, no
    residual), each beside the fp64 reference (``harness.Probe``); the backward fed the
    forward's rstd. fp32 compares to 1e-5, bf16 to 5e-3 (y, dx, dg) and 1e-3 (dw, reduced in fp32)."""
    import functools

    import torch

    from ..gnorm._kernels import bwd, fwd
    from ..gnorm.reference import rms_norm_gated_ref, rms_norm_gated_ref_grads
    from .harness import Probe

    shape = dict(CHECK_SHAPE, **(shape or {}))
    N, V, act = int(shape["N"]), int(shape["V"]), shape["activation"]
    gen = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, shape["dtype"])
    x, g, dy = (torch.randn(N, V, generator=gen, device=device).to(dt) for _ in range(3))
    w = 1 + 0.1 * torch.randn(V, generator=gen, device=device)
    P = functools.partial(Probe, tol=1e-5 if dt == torch.float32 else dict(y=5e-3, dx=5e-3, dg=5e-3, dw=1e-3))
    _, rstd, _ = fwd.gnorm_fwd(x, g, w, None, None, None, 1e-5, act)
    ref_grads = functools.cache(lambda: rms_norm_gated_ref_grads(x, g, w, None, dy, act, None, eps=1e-5))
    return [
        P("gnorm.fwd", lambda c: fwd.gnorm_fwd(x, g, w, None, None, None, 1e-5, act, config=c)[:1],
          lambda: (rms_norm_gated_ref(x, g, w, None, act, None, eps=1e-5),), ("y",), module=fwd),
        P("gnorm.bwd", lambda c: bwd.gnorm_bwd(x, g, w, None, rstd, dy, None, act, x.dtype, None, True, False,
                                               config=c)[:3],
          lambda: tuple(ref_grads()[k] for k in ("x", "g", "weight")), ("dx", "dg", "dw"), module=bwd,
          note="with its fixed-config dw reduction (gnorm.dw_reduce)"),
    ]


def check(device: str = "cpu") -> list[str]:
    """Interpreted correctness check at small shapes against the fp64 reference; returns failures."""
    import torch

    from .. import gnorm
    from .._common.numerics import rel_rms
    from .._common.witness import launches
    from ..gnorm.reference import rms_norm_gated_ref, rms_norm_gated_ref_grads

    failures = []
    gen = torch.Generator().manual_seed(0)
    configs = [
        dict(shape=(2, 3, 2, 32), dtype=torch.float32, act="sigmoid", bias=False, res=False),
        dict(shape=(5, 24), dtype=torch.float16, act="swish", bias=True, res=True),
        dict(shape=(1, 1, 1, 96), dtype=torch.float32, act="silu", bias=False, res=True),
    ]
    for c in configs:
        def rnd(*s):
            return torch.randn(*s, generator=gen).to(device)

        V = c["shape"][-1]
        x = rnd(*c["shape"]).to(c["dtype"]).requires_grad_()
        g = rnd(*c["shape"]).to(c["dtype"]).requires_grad_()
        w = (1 + 0.1 * rnd(V)).requires_grad_()
        b = rnd(V).requires_grad_() if c["bias"] else None
        r = rnd(*c["shape"]).to(c["dtype"]).requires_grad_() if c["res"] else None
        before = launches("gnorm.")
        y = gnorm.rms_norm_gated(x, g, w, b, activation=c["act"], residual=r, eps=1e-5)
        dy = torch.randn(y.shape, generator=gen).to(device).to(y.dtype)
        leaves = [t for t in (x, g, w, b, r) if t is not None]
        grads = torch.autograd.grad(y, leaves, dy)
        if launches("gnorm.") - before < 3:
            failures.append(f"gnorm {c}: our kernels did not run")
            continue
        ref = rms_norm_gated_ref(x.detach(), g.detach(), w.detach(), None if b is None else b.detach(),
                                 c["act"], None if r is None else r.detach(), eps=1e-5)
        rg = rms_norm_gated_ref_grads(x, g, w, b, dy, c["act"], r, eps=1e-5)
        names = [k for k, t in (("x", x), ("g", g), ("weight", w), ("bias", b), ("residual", r)) if t is not None]
        tol = 1e-5 if c["dtype"] == torch.float32 else 3e-3
        for name, a, ref_t in [("y", y, ref)] + [(f"d{k}", gr, rg[k]) for k, gr in zip(names, grads)]:
            err = rel_rms(a, ref_t)
            if not err <= tol:
                failures.append(f"gnorm {c}: {name} relative error {err:.2e} > {tol:.0e}")
    # the launchers at the layers' call, as `bench --stages gnorm` forces them
    from .harness import check_probes

    return failures + check_probes(probes(device))
