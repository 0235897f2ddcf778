"""cconv benchmark cases (production shapes by default) and its interpreted check."""
from __future__ import annotations

import importlib.util

from .harness import Case, Direction

PROD = dict(B=16, T=8192, W=4)
# `--shape` keys (a custom case: the production shape with these replaced)
SHAPE_KEYS = {"B": "batch (16)", "T": "tokens (8192)", "D": "channels (2048)", "W": "kernel width 1..4 (4)",
              "layout": "contiguous | column_slice | transposed"}
TEXT_KEYS = ("layout",)
_LAYOUTS = ("contiguous", "column_slice", "transposed")
# Every shipped kernel, by its launch-witness name; `check` launches each.
KERNELS = {
    "cconv.fwd": "forward, any route: y vs the fp64 reference",
    "cconv.fwd_tma": "the TMA forward: y vs the fp64 reference",
    "cconv.bwd": "backward: dx and the dw/db partials",
    "cconv.dw_reduce": "the fixed-order dw/db reduction: dw, db vs the reference",
}
# `bench --stages cconv`: the reduction has one fixed config and runs inside the backward's probe.
STAGED_WITH = {"cconv.dw_reduce": "cconv.bwd"}


def _check_layout(layout) -> None:
    from .harness import UsageError

    if layout not in _LAYOUTS:
        raise UsageError(f"--shape: layout={layout!r} for cconv must be one of {', '.join(_LAYOUTS)}")


def _layout_x(B, T, D, layout, dt, device, g):
    """x ``[B, T, D]`` of dtype ``dt`` in one of ``_LAYOUTS`` (a ``UsageError`` for another)."""
    import torch

    _check_layout(layout)
    if layout == "contiguous":
        return torch.randn(B, T, D, device=device, dtype=dt, generator=g)
    if layout == "column_slice":  # the middle third of a wider projection [B, T, 3D]
        return torch.randn(B, T, 3 * D, device=device, dtype=dt, generator=g)[..., D:2 * D]
    # transposed: a contiguous [B, D, T] buffer viewed as [B, T, D]
    return torch.randn(B, D, T, device=device, dtype=dt, generator=g).transpose(1, 2)


def _inputs(B, T, D, W, layout="contiguous", dtype="bfloat16", device="cuda", seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = _layout_x(B, T, D, layout, getattr(torch, dtype), device, g)
    x.requires_grad_(True)
    w = (torch.randn(D, W, device=device, dtype=torch.float32, generator=g) / W).requires_grad_(True)
    return x, w


def _case(name, B, T, D, W=4, layout="contiguous", cu_seqlens=None, backend="triton", note=""):
    import torch

    from .. import cconv
    from .._common.compat import fla_symbol

    fla_conv = fla_symbol("fla.modules.causal_conv1d", "causal_conv1d")
    x, w = _inputs(B, T, D, W, layout)
    dy = torch.randn(B, T, D, device="cuda", dtype=x.dtype)
    kw = dict(activation="silu", cu_seqlens=cu_seqlens)

    def ours_fwd():
        return cconv.causal_conv1d(x, w, **kw)[0]

    def fla_fwd():
        return fla_conv(x, w, backend=backend, **kw)[0]

    y_ours, y_fla = ours_fwd(), fla_fwd()
    elt = x.element_size()
    n = B * T * D
    dirs = [
        Direction("fwd", ours_fwd, fla_fwd, nbytes=2 * n * elt),
        Direction("bwd", lambda: torch.autograd.grad(y_ours, (x, w), dy, retain_graph=True),
                  lambda: torch.autograd.grad(y_fla, (x, w), dy, retain_graph=True), nbytes=3 * n * elt),
        Direction("fwdbwd", lambda: torch.autograd.grad(ours_fwd(), (x, w), dy),
                  lambda: torch.autograd.grad(fla_fwd(), (x, w), dy), nbytes=5 * n * elt),
    ]
    shape = dict(B=B, T=T, D=D, W=W, dtype=str(x.dtype).replace("torch.", ""), weight_dtype="float32",
                 activation="silu", layout=layout, fla_backend=backend)
    if cu_seqlens is not None:
        shape["cu_seqlens"] = cu_seqlens.tolist()
    return Case("cconv", name, shape, dirs, witness=("cconv.",), note=note)


def _random_cu_seqlens(T, n_docs, seed=0, device="cuda"):
    import torch

    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(T - 1, generator=g)[: n_docs - 1].add(1).sort().values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(device)


def cases(overrides: dict | None = None):
    """(name, build) pairs: the production cases, or one ``custom`` case for ``--shape``."""
    if overrides:
        from .harness import UsageError

        p = dict(PROD, D=2048, layout="contiguous")
        p.update(overrides)
        _check_layout(p["layout"])  # before any GPU work (the case builds its inputs later)
        if not 1 <= int(p["W"]) <= 4:
            raise UsageError(f"--shape: W={p['W']} for cconv must be 1..4")
        return [("custom", lambda: _case("custom", int(p["B"]), int(p["T"]), int(p["D"]), int(p["W"]),
                                         p["layout"]))]
    out = [
        ("prod_d2048", lambda: _case("prod_d2048", D=2048, **PROD)),
        ("prod_d4096", lambda: _case("prod_d4096", D=4096, **PROD)),
        ("varlen_16docs", lambda: _case("varlen_16docs", 1, 131072, 2048,
                                        cu_seqlens=_random_cu_seqlens(131072, 16))),
        ("column_slice_d2048", lambda: _case("column_slice_d2048", 8, 8192, 2048, layout="column_slice")),
        ("latency_b1_t2048", lambda: _case("latency_b1_t2048", 1, 2048, 2048)),
    ]
    if importlib.util.find_spec("causal_conv1d") is not None:  # Dao's kernels, via fla's cuda backend
        out.append(("prod_d2048_vs_fla_cuda",
                    lambda: _case("prod_d2048_vs_fla_cuda", D=2048, backend="cuda", **PROD)))
    return out


def check(device: str = "cpu") -> list[str]:
    """Interpreted correctness check at small shapes against the fp64 reference; returns
    failures, each starting with the witness name of the kernel that produced the output."""
    import torch

    from .. import cconv
    from .._common.numerics import rel_rms
    from .._common.witness import launches
    from ..cconv.reference import conv_ref, conv_ref_bwd
    from .harness import check_probes

    failures = []
    gen = torch.Generator().manual_seed(0)
    configs = [
        dict(B=2, T=19, D=24, W=4, dtype=torch.float32, act="silu", bias=True, cu=None),
        dict(B=1, T=3, D=7, W=4, dtype=torch.float16, act=None, bias=False, cu=None),
        dict(B=1, T=40, D=16, W=3, dtype=torch.float32, act="silu", bias=True, cu=[0, 1, 9, 30, 40]),
    ]
    for c in configs:
        x = torch.randn(c["B"], c["T"], c["D"], generator=gen).to(c["dtype"]).to(device).requires_grad_()
        w = torch.randn(c["D"], c["W"], generator=gen).to(device).requires_grad_()
        b = torch.randn(c["D"], generator=gen).to(device).requires_grad_() if c["bias"] else None
        cu = torch.tensor(c["cu"], device=device) if c["cu"] is not None else None
        before = launches("cconv.")
        y, _ = cconv.causal_conv1d(x, w, b, activation=c["act"], cu_seqlens=cu)
        dy = torch.randn_like(y)
        grads = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], dy)
        if launches("cconv.") - before < 2:
            failures.append(f"cconv.fwd: {c}: our kernels did not run")
            continue
        silu = c["act"] is not None
        y_ref = conv_ref(x.detach(), w.detach(), None if b is None else b.detach(), silu, cu)
        ref_grads = [g for g in conv_ref_bwd(x, w, b, dy, silu, cu) if g is not None]
        tol = 1e-5 if c["dtype"] == torch.float32 else 3e-3
        kernel = {"y": "cconv.fwd", "dx": "cconv.bwd", "dw": "cconv.dw_reduce", "db": "cconv.dw_reduce"}
        for name, a, r in [("y", y, y_ref)] + list(zip(("dx", "dw", "db"), grads, ref_grads)):
            err = rel_rms(a, r)
            if not err <= tol:
                failures.append(f"{kernel[name]}: {c}: {name} relative error {err:.2e} > {tol:.0e}")
    # the TMA forward, which the public op takes only for x of 32 MB and up: forced
    failures += check_probes([p for p in probes(device, CHECK_SHAPE) if p.kernel == "cconv.fwd_tma"])
    return failures


# The stage probes' shapes: the check's TMA one (fp32 [2, 37, 64], bias) and, for `bench --stages
# cconv` on a GPU, the production call (bf16 [16, 8192, 2048], fp32 weight, no bias, as fla's
# ShortConvolution makes it); `--shape` replaces any of them (layout: one of _LAYOUTS, e.g.
# column_slice, x the middle third of a [B, T, 3D] projection, as the layers' fused q/k/v conv reads it).
CHECK_SHAPE = dict(B=2, T=37, D=64, W=4, dtype="float32", bias=1, layout="contiguous")
STAGE_SHAPES = {"cpu": CHECK_SHAPE,
                "cuda": dict(B=16, T=8192, D=2048, W=4, dtype="bfloat16", bias=0, layout="contiguous")}


def probes(device: str, shape: dict | None = None) -> list:
    """cconv's kernels through their launchers (``conv_fwd`` by pointer and through TMA,
    ``conv_bwd``) with silu, each beside the fp64 reference (``harness.Probe``). fp32 compares
    to 1e-5; bf16 to the old sweep's thresholds (y 5e-3, dx 8e-3, dw and db 1e-3). The TMA
    probe is left out where x cannot be read through a descriptor (before sm_90)."""
    import functools

    import torch

    from ..cconv import reference as R
    from ..cconv._kernels import bwd, fwd
    from .harness import Probe

    shape = dict(CHECK_SHAPE, **(shape or {}))
    B, T, D, W = (int(shape[k]) for k in ("B", "T", "D", "W"))
    gen = torch.Generator(device=device).manual_seed(0)
    x = _layout_x(B, T, D, shape["layout"], getattr(torch, shape["dtype"]), device, gen)
    w = torch.randn(D, W, generator=gen, device=device) / W
    b = torch.randn(D, generator=gen, device=device) if int(shape["bias"]) else None
    dy = torch.randn(B, T, D, generator=gen, device=device).to(x.dtype)
    fp32 = x.dtype == torch.float32
    P = functools.partial(Probe, tol=1e-5 if fp32 else dict(y=5e-3, dx=8e-3, dw=1e-3, db=1e-3))
    ref_y = functools.cache(lambda: (R.conv_ref(x, w, b, True),))
    grads = ("dx", "dw") + (("db",) if b is not None else ())
    out = [P("cconv.fwd", lambda c: (fwd.conv_fwd(x, w, b, True, tma=False, config=c),), ref_y, ("y",), module=fwd)]
    if fwd.tma_ok(x):
        out.append(P("cconv.fwd_tma", lambda c: (fwd.conv_fwd(x, w, b, True, tma=True, config=c),), ref_y, ("y",),
                     module=fwd, lists="TMA_"))
    out.append(P("cconv.bwd", lambda c: bwd.conv_bwd(x, w, b, dy, True, config=c)[:len(grads)],
                 lambda: R.conv_ref_bwd(x, w, b, dy, True)[:len(grads)], grads, module=bwd,
                 note="with its fixed-config dw/db reduction (cconv.dw_reduce)"))
    return out
