"""cconv's public entry: classification, routing with reasons, bad input, switches, the check.

Kernels run through Triton's interpreter on CPU tensors (tests/conftest.py); where a call
routes to fla, fla's entry is replaced by a recorder (fla's kernels do not interpret).
"""
import logging

import pytest
import torch

from kernel_fun import cconv
from kernel_fun._common import capture, compat
from kernel_fun._common.classify import signature_problems
from kernel_fun._common.witness import launches
from kernel_fun.cconv import ops
from kernel_fun.cconv.reference import conv_ref, conv_ref_bwd


@pytest.fixture(autouse=True)
def _clean(clean_state):
    yield


@pytest.fixture
def fla_calls(fla_recorder):
    """Routed calls reach a recorder in place of fla's entry."""
    return fla_recorder(ops, ("fla-result", None))


def _inputs(B=2, T=21, D=12, W=4, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g).to(dtype).requires_grad_()
    w = torch.randn(D, W, generator=g).requires_grad_()
    b = torch.randn(D, generator=g).requires_grad_() if bias else None
    return x, w, b


from kernel_fun._common.numerics import rel_rms as _rel  # noqa: E402


def test_signature_matches_installed_fla():
    fla_fn = compat.fla_symbol("fla.modules.causal_conv1d", "causal_conv1d")
    assert signature_problems(ops.causal_conv1d, fla_fn, ops.RULES) == []
    assert signature_problems(ops.is_supported, fla_fn, ops.RULES) == []


def test_engaged_end_to_end_matches_reference(caplog):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    x, w, b = _inputs()
    before = launches("cconv.")
    y, final = cconv.causal_conv1d(x, w, b, activation="silu")
    assert final is None
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    assert launches("cconv.") - before >= 2  # fwd and bwd were ours
    assert "kernel-fun cconv: engaged" in caplog.text
    y_ref = conv_ref(x.detach(), w.detach(), b.detach(), True)
    rdx, rdw, rdb = conv_ref_bwd(x, w, b, dy, True)
    assert _rel(y, y_ref) < 1e-5
    for got, ref in ((dx, rdx), (dw, rdw), (db, rdb)):
        assert _rel(got, ref) < 1e-5
    assert dw.dtype == w.dtype and db.dtype == b.dtype and dx.dtype == x.dtype


def test_swish_is_silu_and_varlen_through_entry():
    x, w, b = _inputs(B=1, T=30)
    cu = torch.tensor([0, 4, 5, 17, 30])
    y, _ = cconv.causal_conv1d(x, w, b, activation="swish", cu_seqlens=cu)
    assert _rel(y, conv_ref(x.detach(), w.detach(), b.detach(), True, cu)) < 1e-5


@pytest.mark.parametrize("kwargs,needle", [
    (dict(residual="R"), "residual"),
    (dict(initial_state="S"), "initial_state"),
    (dict(backend=None), "backend=None"),
    (dict(output_final_state=True, backend="mix"), "backend='mix'"),
    (dict(backend="gluon"), "backend='gluon'"),
    (dict(cp_context="CP"), "cp_context"),
    (dict(activation="relu"), "activation='relu'"),
    (dict(seq_idx="S"), "'seq_idx' is not classified"),
])
def test_routed_arguments_fall_back_with_reason(fla_calls, caplog, kwargs, needle):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    x, w, b = _inputs()
    # valid tensors for the tensor arguments (their shapes are checked before routing)
    stand_in = {"R": torch.randn_like(x), "S": torch.randn(x.shape[0], x.shape[2], w.shape[1])}
    kwargs = {k: stand_in.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    ok, reason = cconv.is_supported(x, w, b, **kwargs)
    assert not ok and needle in reason
    before = launches("cconv.")
    out = cconv.causal_conv1d(x, w, b, **kwargs)
    assert out == ("fla-result", None)
    assert launches("cconv.") == before
    assert fla_calls[-1]["x"] is x
    for k, v in kwargs.items():
        assert fla_calls[-1][k] is v  # forwarded verbatim
    assert f"falling back to fla: {reason}" in caplog.text


def test_box_limits_route(fla_calls):
    x, w, b = _inputs(W=4)
    assert not cconv.is_supported(x.double(), w)[0]
    w5 = torch.randn(x.shape[-1], 5)
    ok, reason = cconv.is_supported(x, w5)
    assert not ok and "W=5" in reason
    ok, reason = cconv.is_supported(torch.randn(2, 10, 12), w, cu_seqlens=torch.tensor([0, 10]))
    assert not ok and "B == 1" in reason


def test_switches_route_per_call(fla_calls, monkeypatch):
    x, w, b = _inputs()
    monkeypatch.setenv("KERNEL_FUN_CCONV_DISABLE", "1")
    assert cconv.causal_conv1d(x, w, b)[0] == "fla-result"
    monkeypatch.setenv("KERNEL_FUN_CCONV_DISABLE", "0")
    assert isinstance(cconv.causal_conv1d(x, w, b)[0], torch.Tensor)
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "1")
    ok, reason = cconv.is_supported(x, w, b)
    assert not ok and "KERNEL_FUN_DISABLE" in reason


def test_cpu_tensor_without_interpreter_routes(fla_calls, monkeypatch):
    x, w, b = _inputs()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert cconv.is_supported(x, w, b) == (False, "not a CUDA tensor")


@pytest.mark.parametrize("make,match", [
    (lambda: (torch.randn(2, 9, 12), torch.randn(10, 4)), r"x \(2, 9, 12\) and weight \(10, 4\) disagree on D"),
    (lambda: (torch.randn(2, 9, 12), torch.randn(12, 4, 1)), r"weight must be \[D, W\], got shape \(12, 4, 1\)"),
    (lambda: (torch.randn(2, 9, 12), torch.randn(12, 0)), r"weight \(12, 0\) has width W=0"),
    (lambda: (torch.randint(0, 5, (2, 9, 12)), torch.randn(12, 4)), "x must be a float tensor, got torch.int64"),
    (lambda: (torch.randn(2, 9, 12), torch.randint(0, 5, (12, 4))), "weight must be a float tensor, got torch.int64"),
    (lambda: (torch.randn(9, 12), torch.randn(12, 4)), r"x must be \[B, T, D\], got shape \(9, 12\)"),
])
def test_bad_input_is_a_clear_value_error(fla_calls, make, match):
    x, w = make()
    before = launches("cconv.")
    with pytest.raises(ValueError, match=match):
        cconv.causal_conv1d(x, w)
    with pytest.raises(ValueError, match=match):
        cconv.is_supported(x, w)
    assert launches("cconv.") == before and not fla_calls


@pytest.mark.parametrize("kwargs,match", [
    (dict(bias=torch.randn(11)), r"bias must be \[D\] = \[12\], got shape \(11,\)"),
    (dict(bias=torch.randn(12, 1)), r"bias must be \[D\] = \[12\], got shape \(12, 1\)"),
    (dict(bias=torch.arange(12)), "bias must be a float tensor, got torch.int64"),
    (dict(residual=torch.randn(2, 9, 11)), r"residual must be \[B, T, D\] = \[2, 9, 12\], got shape \(2, 9, 11\)"),
    # initial_state routes to fla, whose kernels index it as a contiguous [N, D, W] unchecked:
    # its shape is checked before routing
    (dict(initial_state=torch.randn(2, 12, 3)), r"initial_state must be \[N, D, W\] = \[2, 12, 4\]"),
    (dict(initial_state=torch.randn(1, 12, 4)), r"initial_state must be \[N, D, W\] = \[2, 12, 4\]"),
    (dict(initial_state=torch.zeros(2, 12, 4, dtype=torch.int32)), "initial_state must be a float tensor"),
])
def test_bad_auxiliary_tensors_are_a_clear_value_error(fla_calls, kwargs, match):
    x, w = torch.randn(2, 9, 12), torch.randn(12, 4)
    before = launches("cconv.")
    with pytest.raises(ValueError, match=match):
        cconv.causal_conv1d(x, w, **kwargs)
    assert launches("cconv.") == before and not fla_calls


def test_initial_state_with_cu_seqlens_counts_documents(fla_calls):
    x, w, cu = torch.randn(1, 10, 8), torch.randn(8, 4), torch.tensor([0, 3, 10])
    with pytest.raises(ValueError, match=r"\[N, D, W\] = \[2, 8, 4\]"):
        cconv.causal_conv1d(x, w, initial_state=torch.randn(1, 8, 4), cu_seqlens=cu)
    # the right shape is valid input: it routes (fla handles states)
    assert cconv.causal_conv1d(x, w, initial_state=torch.randn(2, 8, 4), cu_seqlens=cu) == ("fla-result", None)


@pytest.mark.parametrize("shape", [(0, 9, 12), (2, 0, 12), (2, 9, 0)])
def test_empty_dims_are_ours_without_a_launch(fla_calls, shape):
    """B, T or D of 0: our path answers (y empty, gradients zero) without launching anything,
    so nothing depends on how a launcher treats a zero-size grid."""
    B, T, D = shape
    x = torch.randn(B, T, D, requires_grad=True)
    w = torch.randn(D, 4, requires_grad=True)
    b = torch.randn(D, requires_grad=True)
    assert cconv.is_supported(x, w, b, activation="silu") == (True, "")
    before = launches("cconv.")
    y, final = cconv.causal_conv1d(x, w, b, activation="silu")
    assert y.shape == (B, T, D) and final is None and not fla_calls
    dx, dw, db = torch.autograd.grad(y.sum(), (x, w, b), allow_unused=True)
    assert launches("cconv.") == before
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))


@pytest.mark.parametrize("backend", ["triton", "cuda", "mix"])
def test_every_fla_backend_engages_ours(backend):
    """fla's backends are implementations of one function; ours replaces each."""
    x, w, b = _inputs()
    assert cconv.is_supported(x, w, b, activation="silu", backend=backend) == (True, "")
    before = launches("cconv.fwd")
    y, _ = cconv.causal_conv1d(x, w, b, activation="silu", backend=backend)
    assert launches("cconv.fwd") == before + 1
    assert _rel(y, conv_ref(x.detach(), w.detach(), b.detach(), True)) < 1e-5


@pytest.mark.parametrize("backend,varlen", [("triton", False), ("cuda", False), ("triton", True)])
def test_short_convolution_forward_engages_ours(monkeypatch, backend, varlen):
    """fla's ShortConvolution.forward, unchanged, with its module-level causal_conv1d pointed at
    ours (what patch_fla does): its exact call (weight a rearranged view, bias, activation,
    backend, initial_state=cache, chunk_indices, **kwargs) is classified and engages."""
    import fla.modules.causal_conv1d.ops as fla_ops

    monkeypatch.setattr(fla_ops, "causal_conv1d", ops.causal_conv1d)
    monkeypatch.setattr(fla_ops, "causal_conv1d_fn_cuda", object(), raising=False)  # "installed"
    monkeypatch.delenv("FLA_CONV_BACKEND", raising=False)
    D, W = 16, 4
    conv = fla_ops.ShortConvolution(D, W, bias=True, activation="silu", backend=backend)
    assert conv.backend == backend
    B, T = (1, 30) if varlen else (2, 13)
    x = torch.randn(B, T, D, requires_grad=True)
    cu = torch.tensor([0, 7, 8, 30]) if varlen else None
    fwd0, bwd0 = launches("cconv.fwd"), launches("cconv.bwd")
    y, cache = conv(x, cu_seqlens=cu)  # the layers' call: cache=None, output_final_state=False
    assert cache is None
    y.backward(torch.ones_like(y))
    assert launches("cconv.fwd") > fwd0 and launches("cconv.bwd") > bwd0
    w = conv.weight.detach()[:, 0, :]
    assert _rel(y, conv_ref(x.detach(), w, conv.bias.detach(), True, cu)) < 1e-5


@pytest.mark.parametrize("cu,match", [
    ([1, 5, 10], "start at 0"),
    ([0, 6, 5, 10], "non-decreasing"),
    ([0, 5, 9], "end at T=10"),
])
def test_malformed_cu_seqlens(cu, match):
    x = torch.randn(1, 10, 8)
    w = torch.randn(8, 4)
    with pytest.raises(ValueError, match=match):
        cconv.causal_conv1d(x, w, cu_seqlens=torch.tensor(cu))


def test_capture_gate_routes_cold_signature(fla_calls, monkeypatch):
    x, w, b = _inputs()
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    ok, reason = cconv.is_supported(x, w, b, activation="silu")
    assert not ok and "capture" in reason
    monkeypatch.setattr(capture, "_capturing", lambda: False)
    y, _ = cconv.causal_conv1d(x, w, b, activation="silu")  # eager fwd + bwd warm it
    y.backward(torch.ones_like(y))
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert cconv.is_supported(x, w, b, activation="silu") == (True, "")
    with torch.no_grad():
        assert cconv.is_supported(x, w, b, activation="silu")[0]
    # same shape and strides, base off 16 bytes: other kernels and configs, so still cold
    x_off = torch.randn(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)
    assert not cconv.is_supported(x_off, w, b, activation="silu")[0]
    # the forward's kernel changes with the TMA switch: a TMA-sized x warmed with it on is
    # cold with it off
    from kernel_fun.cconv._kernels import fwd as fwd_mod

    monkeypatch.setattr(fwd_mod, "_TMA_MIN_BYTES", 0)
    x2, w2, b2 = _inputs(T=17)
    assert fwd_mod.use_tma(x2)
    monkeypatch.setattr(capture, "_capturing", lambda: False)
    y, _ = cconv.causal_conv1d(x2, w2, b2, activation="silu")
    y.backward(torch.ones_like(y))
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert cconv.is_supported(x2, w2, b2, activation="silu")[0]
    monkeypatch.setenv("KERNEL_FUN_CCONV_TMA", "0")
    assert not cconv.is_supported(x2, w2, b2, activation="silu")[0]


def test_drift_routes_under_fallback(fla_calls, monkeypatch):
    import fla.ops.kda

    monkeypatch.delattr(fla.ops.kda, "chunk_kda")
    compat.reset()
    x, w, b = _inputs()
    with pytest.raises(compat.FlaDriftError):
        cconv.causal_conv1d(x, w, b)
    monkeypatch.setenv("KERNEL_FUN_FALLBACK", "1")
    with pytest.warns(RuntimeWarning):
        assert cconv.causal_conv1d(x, w, b)[0] == "fla-result"


def test_interpreted_check_passes():
    from kernel_fun.bench.cconv import check

    assert check("cpu") == []


def test_without_fla_a_call_raises_import_error_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(compat, "_fla_version", lambda: None)
    compat.reset()
    x, w, b = _inputs()
    with pytest.raises(ImportError, match="pip install 'fla-core"):
        cconv.causal_conv1d(x, w, b)
    compat.reset()


def test_warmup_compiles_and_shows_progress(capsys):
    cconv.warmup(B=1, T=9, D=(8, 16), W=3, dtype=torch.float32, activation="silu", bias=True)
    err = capsys.readouterr().err
    assert "kernel-fun cconv warmup [1/2]" in err and "[2/2]" in err


def _final_state_ref(x, W, cu=None):
    """fla's conv state after a call without initial_state, by its definition: slot w of sequence
    n is x at the sequence's token end - W + w, zero before its first token."""
    B, T, D = x.shape
    bounds = [(b, 0, T) for b in range(B)] if cu is None else [(0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    out = torch.zeros(len(bounds), D, W, dtype=x.dtype)
    for n, (b, s, e) in enumerate(bounds):
        for w in range(W):
            t = e - W + w
            if t >= s:
                out[n, :, w] = x[b, t]
    return out


@pytest.mark.parametrize("B,T,cu", [(2, 13, None), (1, 2, None), (1, 30, [0, 7, 8, 8, 30])],
                         ids=["dense", "shorter_than_W", "varlen_short_and_empty_documents"])
def test_output_final_state_is_ours(B, T, cu):
    """Generation's prefill asks for the conv state (ShortConvolution with use_cache): ours returns
    fla's state, the last W inputs of each sequence, and its gradient reaches x; y as without it."""
    W = 4
    x, w, b = _inputs(B=B, T=T, W=W)
    cu_t = None if cu is None else torch.tensor(cu)
    before = launches("cconv.fwd")
    y, state = cconv.causal_conv1d(x, w, b, activation="silu", cu_seqlens=cu_t, output_final_state=True)
    assert launches("cconv.fwd") == before + 1
    ref = _final_state_ref(x.detach(), W, cu)
    assert state.shape == ref.shape and state.dtype == x.dtype and torch.equal(state.detach(), ref)
    y0, none = cconv.causal_conv1d(x, w, b, activation="silu", cu_seqlens=cu_t)
    assert none is None and torch.equal(y, y0)
    ds = torch.randn_like(state)
    (gx,) = torch.autograd.grad(state, x, ds)
    (gx_ref,) = torch.autograd.grad(_final_state_ref(x, W, cu), x, ds)  # the same indexing, in a loop
    assert torch.equal(gx, gx_ref)


def test_short_convolution_prefill_with_a_cache_engages_ours(monkeypatch):
    """ShortConvolution as a layer calls it in a prefill (``output_final_state=True``, no cache yet):
    ours runs and returns the state fla's module caches."""
    import fla.modules.causal_conv1d.ops as fla_ops

    monkeypatch.setattr(fla_ops, "causal_conv1d", ops.causal_conv1d)
    D, W = 16, 4
    conv = fla_ops.ShortConvolution(D, W, bias=False, activation="silu", backend="triton")
    x = torch.randn(1, 40, D)
    before = launches("cconv.fwd")
    with torch.no_grad():
        y, cache = conv(x, output_final_state=True)
    assert launches("cconv.fwd") == before + 1
    assert torch.equal(cache, _final_state_ref(x, W))
    assert _rel(y, conv_ref(x, conv.weight[:, 0, :], None, True)) < 1e-5
