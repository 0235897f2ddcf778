"""cconv kernels on the GPU at real shapes: parity with the fp64 reference (and with fla's own
Triton kernel as a second oracle), bf16, strided inputs, packed documents, > 2**31-element
tensors, bitwise-deterministic dw/db. The small-shape suite in test_kernels.py also runs
compiled on the GPU (its `device` fixture), every autotune config included."""
from __future__ import annotations

import pytest
import torch

from kernel_fun._common.witness import launch_counts
from kernel_fun.cconv._kernels import bwd as bwd_mod
from kernel_fun.cconv._kernels import fwd as fwd_mod
from kernel_fun.cconv._kernels.bwd import conv_bwd
from kernel_fun.cconv._kernels.fwd import conv_fwd
from kernel_fun.cconv.reference import conv_ref, conv_ref_bwd

pytestmark = pytest.mark.gpu

# Relative RMS error ceilings by the dtype an output is rounded to (bf16 rounding alone is
# ~1.1e-3 RMS; fla's own conv tests allow more).
TOL = {torch.bfloat16: 5e-3, torch.float16: 2e-3, torch.float32: 1e-5}


from kernel_fun._common.numerics import rel_rms as rel_err  # noqa: E402


@pytest.fixture(autouse=True)
def poison(poison_outputs):
    """Outputs start as NaN (the root conftest's poison_outputs)."""

def _inputs(B, T, D, W, dtype, layout="contig", bias=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "contig":
        x = torch.randn(B, T, D, device="cuda", generator=g).to(dtype)
    elif layout == "slice":  # q/k/v column block of a fused projection
        x = torch.randn(B, T, 3 * D, device="cuda", generator=g).to(dtype)[..., D:2 * D]
    elif layout == "transposed":
        x = torch.randn(B, D, T, device="cuda", generator=g).to(dtype).transpose(1, 2)
    else:
        raise ValueError(layout)
    w = torch.randn(D, W, device="cuda", generator=g) / W ** 0.5
    b = torch.randn(D, device="cuda", generator=g) if bias else None
    dy = torch.randn(B, T, D, device="cuda", generator=g).to(dtype)
    return x, w, b, dy


def _assert_close(name, out, ref, dtype):
    assert torch.isfinite(out).all(), f"{name}: NaN-poisoned (unwritten) or non-finite"
    err = rel_err(out, ref)
    limit = max(TOL[dtype], TOL[out.dtype])
    assert err < limit, f"{name} rel err {err:.3e} >= {limit:.0e}"


def _check_all(x, w, b, dy, silu, cu=None):
    n0 = launch_counts("cconv.")
    y = conv_fwd(x, w, b, silu, cu)
    dx, dw, db = conv_bwd(x, w, b, dy, silu, cu)
    torch.cuda.synchronize()
    n1 = launch_counts("cconv.")
    for stage in ("cconv.fwd", "cconv.bwd", "cconv.dw_reduce"):
        assert n1.get(stage, 0) == n0.get(stage, 0) + 1, stage
    tma = n1.get("cconv.fwd_tma", 0) - n0.get("cconv.fwd_tma", 0)
    assert tma == int(fwd_mod.use_tma(x)), "the forward took the other path"
    _assert_close("y", y, conv_ref(x, w, b, silu, cu), x.dtype)
    rdx, rdw, rdb = conv_ref_bwd(x, w, b, dy, silu, cu)
    _assert_close("dx", dx, rdx, x.dtype)
    _assert_close("dw", dw, rdw, x.dtype)
    if b is not None:
        _assert_close("db", db, rdb, x.dtype)


# A covering set rather than the full product (each new autotune key compiles every config):
# every shape in bf16 at W=4, every dtype, every W, odd D and a T-tail.
PARITY = [
    (2, 4096, 2048, 4, torch.bfloat16), (1, 2048, 2048, 4, torch.bfloat16),
    (3, 1000, 4096 + 8, 4, torch.bfloat16), (4, 333, 129, 4, torch.bfloat16),
    (2, 4096, 2048, 2, torch.bfloat16), (3, 1000, 4096 + 8, 3, torch.float16),
    (4, 333, 129, 2, torch.float16), (2, 4096, 2048, 4, torch.float32), (4, 333, 129, 1, torch.float32),
]


@pytest.mark.parametrize("B,T,D,W,dtype", PARITY)
def test_parity_real_shapes(B, T, D, W, dtype, fwd_path):
    x, w, b, dy = _inputs(B, T, D, W, dtype, seed=B + T + D + W)
    _check_all(x, w, b, dy, silu=True)


@pytest.mark.parametrize("layout", ["slice", "transposed"])
@pytest.mark.parametrize("silu,bias", [(True, False), (False, True)])
def test_parity_strided(layout, silu, bias, fwd_path):
    x, w, b, dy = _inputs(2, 3000, 1024, 4, torch.bfloat16, layout=layout, bias=bias, seed=5)
    _check_all(x, w, b, dy, silu=silu)
    # dy in a transposed layout too (the backward takes any strides)
    _check_all(x, w, b, dy.transpose(1, 2).contiguous().transpose(1, 2), silu=silu)


def _random_cu(T, seed, max_len=700):
    g = torch.Generator().manual_seed(seed)
    cuts = [0]
    while cuts[-1] < T:
        r = torch.rand((), generator=g).item()
        n = 1 if r < 0.2 else (int(torch.randint(2, 5, (), generator=g)) if r < 0.4 else
                               int(torch.randint(5, max_len, (), generator=g)))
        cuts.append(min(T, cuts[-1] + n))
    return torch.tensor(cuts, dtype=torch.int64, device="cuda")


@pytest.mark.parametrize("W", [3, 4])
@pytest.mark.parametrize("layout", ["contig", "slice"])
def test_parity_varlen(W, layout, fwd_path):
    T = 40000
    cu = _random_cu(T, seed=W)
    x, w, b, dy = _inputs(1, T, 768, W, torch.bfloat16, layout=layout, seed=W)
    _check_all(x, w, b, dy, silu=True, cu=cu)


@pytest.mark.parametrize("max_rows", [16, 10 ** 9])
def test_chunk_extremes(max_rows, monkeypatch, fwd_path):
    """Shortest chunks (most dw partials, most halo re-reads) and one wave of long chunks."""
    monkeypatch.setattr(fwd_mod, "_MAX_ROWS_FWD", max_rows)
    monkeypatch.setattr(fwd_mod, "_MAX_ROWS_TMA", max_rows)
    monkeypatch.setattr(bwd_mod, "_MAX_ROWS_BWD", max_rows)
    x, w, b, dy = _inputs(4, 4099, 1024, 4, torch.bfloat16, seed=6)
    _check_all(x, w, b, dy, silu=True)


def test_matches_fla():
    """fla 0.6.0's Triton kernel as a second oracle (dense input: fla's varlen dw is off)."""
    fla_conv = pytest.importorskip("fla.modules.causal_conv1d").causal_conv1d
    x, w, b, dy = _inputs(2, 4096, 2048, 4, torch.bfloat16, seed=1)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y_fla, _ = fla_conv(xr, wr, br, activation="silu", backend="triton")
    y_fla.backward(dy)
    y = conv_fwd(x, w, b, True)
    dx, dw, db = conv_bwd(x, w, b, dy, True)
    for name, ours, theirs in (("y", y, y_fla), ("dx", dx, xr.grad), ("dw", dw, wr.grad), ("db", db, br.grad)):
        err = rel_err(ours, theirs.detach())
        assert err < 1e-2, f"{name} vs fla rel err {err:.3e}"


def test_deterministic():
    x, w, b, dy = _inputs(4, 8192, 2048, 4, torch.bfloat16, seed=2)
    first = conv_bwd(x, w, b, dy, True)
    for _ in range(3):
        again = conv_bwd(x, w, b, dy, True)
        for a, c in zip(first, again):
            assert torch.equal(a, c)
    cu = _random_cu(16384, seed=3)
    x, w, b, dy = _inputs(1, 16384, 1024, 4, torch.bfloat16, seed=3)
    first = conv_bwd(x, w, b, dy, True, cu)
    again = conv_bwd(x, w, b, dy, True, cu)
    for a, c in zip(first, again):
        assert torch.equal(a, c)


def _dw_db_chunked(x, w, b, dy, silu, rows=1 << 16):
    """fp64 dw, db of a huge dense input, chunk by chunk (W-1 halo rows of x per chunk)."""
    B, T, D = x.shape
    W = w.shape[1]
    dw = torch.zeros(D, W, dtype=torch.float64, device=x.device)
    db = torch.zeros(D, dtype=torch.float64, device=x.device)
    for bi in range(B):
        for t0 in range(0, T, rows):
            lo, hi = max(0, t0 - (W - 1)), min(T, t0 + rows)
            xs = x[bi:bi + 1, lo:hi].double()
            pre = conv_ref(xs, w, b, False)[:, t0 - lo:]
            g = dy[bi:bi + 1, t0:hi].double()
            dpre = g * torch.sigmoid(pre) * (1 + pre * (1 - torch.sigmoid(pre))) if silu else g
            xpad = torch.nn.functional.pad(xs, (0, 0, (W - 1) - (t0 - lo), 0))  # rows t0-(W-1) ..
            for i in range(W):
                dw[:, i] += (dpre * xpad[:, i:i + (hi - t0)]).sum((0, 1))
            db += dpre.sum((0, 1))
    return dw, db


@pytest.mark.slow
@pytest.mark.parametrize("B,T", [(1, 2 ** 20 + 3), (3, 2 ** 19 + 5)])
def test_over_2_31_elements(B, T):
    """B*T*D > 2**31 (row offsets, then batch offsets, past int32): the tail rows and the
    full dw/db against fp64."""
    D, W = 2048, 4
    assert B * T * D > 2 ** 31
    x, w, b, dy = _inputs(B, T, D, W, torch.bfloat16, seed=B)
    ys = {tma: conv_fwd(x, w, b, True, tma=tma) for tma in (True, False)}  # both forwards
    dx, dw, db = conv_bwd(x, w, b, dy, True)
    torch.cuda.synchronize()
    for bi in (0, B - 1):
        for t0 in (0, T // 2, T - 200):
            lo = max(0, t0 - (W - 1))
            sl = slice(lo, min(T, t0 + 200))
            ry = conv_ref(x[bi:bi + 1, sl], w, b, True)[:, t0 - lo:]
            for tma, y in ys.items():
                _assert_close(f"y[{bi}, {t0}:] tma={tma}", y[bi:bi + 1, t0:sl.stop], ry, x.dtype)
            # dx rows t0 .. t0+190 depend on dy up to t0+193: the window is wide enough
            hi = min(T, t0 + 200)
            rdx, _, _ = conv_ref_bwd(x[bi:bi + 1, lo:hi], w, b, dy[bi:bi + 1, lo:hi], True)
            stop = hi if hi == T else hi - (W - 1)
            _assert_close(f"dx[{bi}, {t0}:]", dx[bi:bi + 1, t0:stop], rdx[:, t0 - lo:stop - lo], x.dtype)
    rdw, rdb = _dw_db_chunked(x, w, b, dy, True)
    _assert_close("dw", dw, rdw, torch.float32)
    _assert_close("db", db, rdb, torch.float32)
