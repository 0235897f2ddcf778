"""gnorm's public entry and module: classification, routing with reasons, bad input, switches,
the capture gate, the module's drop-in contract and the exact calls fla's layers make.

Kernels run through Triton's interpreter on CPU tensors (tests/conftest.py); where a call
routes to fla, fla's entry is replaced by a recorder (fla's kernels do not interpret).
"""
import inspect
import logging

import pytest
import torch

from kernel_fun import gnorm
from kernel_fun._common import capture, compat
from kernel_fun._common.classify import signature_problems
from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launches
from kernel_fun.gnorm import ops

from gnorm_cases import check_errs, compare, make_inputs  # noqa: E402  (conftest: this folder on sys.path)

FLA_MOD = "fla.modules.norm.fused_norm_gate"


@pytest.fixture(autouse=True)
def _clean(clean_state):
    yield


@pytest.fixture
def fla_calls(fla_recorder):
    return fla_recorder(ops, "fla-result")


def _xgw(shape=(2, 5, 32), dtype=torch.float32):
    t = make_inputs(shape, dtype)
    return t["x"], t["g"], t["weight"]


def test_signature_matches_installed_fla():
    fla_fn = compat.fla_symbol(FLA_MOD, "rms_norm_gated")
    assert signature_problems(ops.rms_norm_gated, fla_fn, ops.RULES) == []
    assert signature_problems(ops.is_supported, fla_fn, ops.RULES) == []


def test_a_new_fla_parameter_would_fail_the_signature_check():
    fla_fn = compat.fla_symbol(FLA_MOD, "rms_norm_gated")

    def fla_next(*a, new_flag=False, **k):
        pass

    fla_next.__signature__ = inspect.signature(fla_fn).replace(parameters=[
        *inspect.signature(fla_fn).parameters.values(),
        inspect.Parameter("new_flag", inspect.Parameter.KEYWORD_ONLY, default=False)])
    assert "fla parameter 'new_flag' is not classified" in signature_problems(ops.rms_norm_gated, fla_next, ops.RULES)


def test_module_matches_fla_module():
    from fla.modules.norm.fused_norm_gate import FusedRMSNormGated as FlaNorm

    for name in ("__init__", "forward"):
        assert inspect.signature(getattr(gnorm.FusedRMSNormGated, name)) == inspect.signature(getattr(FlaNorm, name))
    assert not issubclass(gnorm.FusedRMSNormGated, FlaNorm)
    for kw in (dict(activation="sigmoid", eps=1e-5), dict(elementwise_affine=False), dict()):
        a, b = FlaNorm(64, **kw), gnorm.FusedRMSNormGated(64, **kw)
        assert repr(a).replace("FusedRMSNormGated", "") == repr(b).replace("FusedRMSNormGated", "")
        assert [(n, None if p is None else p.shape) for n, p in a._parameters.items()] == \
               [(n, None if p is None else p.shape) for n, p in b._parameters.items()]
        sd = {k: torch.randn_like(v) for k, v in a.state_dict().items()}
        a.load_state_dict(sd)
        b.load_state_dict(a.state_dict())  # loads both ways, strictly
        a.load_state_dict(b.state_dict())
    with pytest.raises(ValueError, match="Unsupported activation"):
        gnorm.FusedRMSNormGated(8, activation="relu")


def test_engaged_end_to_end_and_logged(caplog):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    inp = make_inputs((2, 3, 4, 32), torch.float32, bias=True, residual=torch.float32)
    before = launches("gnorm.")
    errs, _ = compare(gnorm.rms_norm_gated, inp, "swish", prenorm=True)
    assert launches("gnorm.fwd") and launches("gnorm.bwd") and launches("gnorm.dw_reduce")
    assert launches("gnorm.") - before == 3
    assert "kernel-fun gnorm: engaged" in caplog.text
    check_errs(errs, 1e-5)


# The calls fla 0.6.0's layers make: `self.o_norm(o, g)` on [B, T, HV, V] with the layer's
# own FusedRMSNormGated (KDA: sigmoid, V = head_dim * expand_v, 128 at the 0.6.0 defaults and
# 256 with expand_v=2, the baselines' KDA shape; GDN: output_gate_activation, default swish,
# V = 512 at its defaults, 128 with head_dim 128 and expand_v 1).
@pytest.mark.parametrize("layer,kwargs", [
    ("KimiDeltaAttention", dict()),
    ("KimiDeltaAttention", dict(expand_v=2, num_heads=2)),
    ("GatedDeltaNet", dict(head_dim=128, expand_v=1, num_heads=4)),
    ("GatedDeltaNet", dict(num_heads=2)),
    ("GatedDeltaNet", dict(head_dim=64, num_heads=2, output_gate_activation="sigmoid")),
])
def test_the_layers_exact_calls_engage(layer, kwargs):
    import fla.layers

    lyr = getattr(fla.layers, layer)(hidden_size=256, **kwargs)
    fla_norm = lyr.o_norm
    ours = gnorm.FusedRMSNormGated(fla_norm.hidden_size, fla_norm.elementwise_affine, fla_norm.eps,
                                   fla_norm.activation)
    with torch.no_grad():
        fla_norm.weight.uniform_(0.5, 1.5)
    ours.load_state_dict(fla_norm.state_dict())
    B, T, HV, V = 1, 3, lyr.num_v_heads, lyr.head_v_dim
    o = torch.randn(B, T, HV, V, requires_grad=True)
    g = (2 * torch.randn(B, T, HV, V)).requires_grad_()
    assert ops.is_supported(o, g, ours.weight, ours.bias, activation=ours.activation, eps=ours.eps) == (True, "")
    before = launches("gnorm.")
    out = ours(o, g)
    out.backward(torch.ones_like(out))
    assert launches("gnorm.") - before == 3  # fwd, bwd, dw reduce: ours
    from kernel_fun.gnorm.reference import rms_norm_gated_ref

    ref = rms_norm_gated_ref(o.detach(), g.detach(), fla_norm.weight.detach(), None, fla_norm.activation,
                             eps=fla_norm.eps)
    assert rel_rms(out, ref) < 1e-5

    # fla's own module forward, with its `rms_norm_gated` name bound to ours (what patch_fla does):
    # the call it makes is in our box and engages
    import fla.modules.norm.fused_norm_gate as fng

    orig = fng.rms_norm_gated
    fng.rms_norm_gated = gnorm.rms_norm_gated
    try:
        before = launches("gnorm.fwd")
        out2 = fla_norm(o, g)
        assert launches("gnorm.fwd") == before + 1
        assert torch.equal(out2, out)
    finally:
        fng.rms_norm_gated = orig


@pytest.mark.parametrize("kwargs,needle", [
    (dict(activation="relu"), "activation='relu'"),
    (dict(activation=None), "activation=None"),
    (dict(prenorm=1), "prenorm=1"),
    (dict(residual_in_fp32=None), "residual_in_fp32=None"),
    (dict(eps=torch.tensor(1e-5)), "eps=tensor"),
    (dict(is_rms_norm=True), "'is_rms_norm' is not classified"),
])
def test_routed_arguments_fall_back_with_reason(fla_calls, caplog, kwargs, needle):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    x, g, w = _xgw()
    ok, reason = gnorm.is_supported(x, g, w, None, **kwargs)
    assert not ok and needle in reason, reason
    before = launches("gnorm.")
    assert gnorm.rms_norm_gated(x, g, w, None, **kwargs) == "fla-result"
    assert launches("gnorm.") == before
    call = fla_calls[-1]
    assert call["x"] is x and call["g"] is g and call["weight"] is w and call["bias"] is None
    for k, v in kwargs.items():
        assert call[k] is v  # forwarded verbatim
    assert f"falling back to fla: {reason}" in caplog.text


def test_box_limits_route(fla_calls):
    x, g, w = _xgw()
    ok, reason = gnorm.is_supported(x.double(), g.double(), w, None)
    assert not ok and "x dtype torch.float64" in reason
    ok, reason = gnorm.is_supported(x, g, w.double(), None)
    assert not ok and "weight dtype torch.float64" in reason
    wide = torch.randn(1, 8193)
    ok, reason = gnorm.is_supported(wide, wide, None, None)
    assert not ok and "V=8193" in reason
    assert gnorm.rms_norm_gated(wide, wide, None, None) == "fla-result"
    empty = torch.randn(2, 0)
    ok, reason = gnorm.is_supported(empty, empty, None, None)
    assert not ok and "V=0" in reason


def test_switches_route_per_call(fla_calls, monkeypatch):
    x, g, w = _xgw()
    monkeypatch.setenv("KERNEL_FUN_GNORM_DISABLE", "1")
    assert gnorm.rms_norm_gated(x, g, w, None) == "fla-result"
    monkeypatch.setenv("KERNEL_FUN_GNORM_DISABLE", "0")
    assert isinstance(gnorm.rms_norm_gated(x, g, w, None), torch.Tensor)
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "1")
    ok, reason = gnorm.is_supported(x, g, w, None)
    assert not ok and "KERNEL_FUN_DISABLE" in reason


def test_cpu_tensor_without_interpreter_routes(fla_calls, monkeypatch):
    x, g, w = _xgw()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert gnorm.is_supported(x, g, w, None) == (False, "not a CUDA tensor")


@pytest.mark.parametrize("make,match", [
    (lambda x, g, w: (x, g, torch.randn(31), None, None), r"weight must be \[V\] = \[32\]"),
    (lambda x, g, w: (x, g, w, torch.randn(2, 32), None), r"bias must be \[V\]"),
    (lambda x, g, w: (x, g[:, :4], w, None, None), "g must have x's shape"),
    (lambda x, g, w: (x, g, w, None, torch.randn(2, 5, 16)), "residual must have x's shape"),
    (lambda x, g, w: (x.detach().long(), g, w, None, None), "x must be a float tensor"),
    (lambda x, g, w: (x, g.detach().int(), w, None, None), "g must be a float tensor"),
    (lambda x, g, w: (x, g, w.detach().long(), None, None), "weight must be a float tensor"),
    (lambda x, g, w: (torch.tensor(1.0), torch.tensor(1.0), None, None, None), r"x must be a tensor \[\.\.\., V\]"),
])
def test_bad_input_is_a_clear_value_error(make, match):
    x, g, w, b, r = make(*_xgw())
    with pytest.raises(ValueError, match=match):
        gnorm.rms_norm_gated(x, g, w, b, residual=r)


def test_capture_gate_routes_cold_signature(fla_calls, monkeypatch):
    x, g, w = _xgw()
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    ok, reason = gnorm.is_supported(x, g, w, None, activation="sigmoid")
    assert not ok and "capture" in reason
    monkeypatch.setattr(capture, "_capturing", lambda: False)
    y = gnorm.rms_norm_gated(x, g, w, None, activation="sigmoid")  # eager fwd + bwd warm it
    y.backward(torch.ones_like(y))
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert gnorm.is_supported(x, g, w, None, activation="sigmoid") == (True, "")
    with torch.no_grad():
        assert gnorm.is_supported(x, g, w, None, activation="sigmoid")[0]
    # another activation, a residual, or prenorm (the backward adds h's gradient) is another
    # kernel variant: cold
    assert not gnorm.is_supported(x, g, w, None, activation="swish")[0]
    assert not gnorm.is_supported(x, g, w, None, activation="sigmoid", prenorm=True)[0]
    assert not gnorm.is_supported(x, g, w, None, activation="sigmoid", residual=torch.randn_like(x))[0]


def test_drift_routes_under_fallback(fla_calls, monkeypatch):
    import fla.modules.norm.fused_norm_gate as fng

    monkeypatch.delattr(fng, "rms_norm_gated")
    compat.reset()
    x, g, w = _xgw()
    with pytest.raises(compat.FlaDriftError):
        gnorm.rms_norm_gated(x, g, w, None)
    monkeypatch.setenv("KERNEL_FUN_FALLBACK", "1")
    with pytest.warns(RuntimeWarning):
        assert gnorm.rms_norm_gated(x, g, w, None) == "fla-result"


def test_interpreted_check_passes():
    from kernel_fun.bench.gnorm import check

    assert check("cpu") == []


def test_bench_lists_the_layer_cases():
    from kernel_fun.bench.gnorm import cases

    names = [n for n, _ in cases()]
    assert names == ["kda_v256_sigmoid", "gdn_v128_swish", "latency_n4096_v256"]
    assert [n for n, _ in cases({"V": "128"})] == ["custom"]


def test_warmup_compiles_and_shows_progress(capsys):
    gnorm.warmup(N=5, V=(16, 24), dtype=torch.float32, activation="sigmoid")
    err = capsys.readouterr().err
    assert "kernel-fun gnorm warmup [1/2]" in err and "[2/2]" in err


def test_kept_verdicts_answer_as_the_full_checks(fla_calls, monkeypatch):
    """A call whose static key was seen skips the classification and the box; the answer is
    the same, bad input still raises every time, and the per-call gates (switches, capture)
    still apply to a kept verdict."""
    x, g, w = _xgw()
    calls = [dict(x=x, g=g, weight=w, bias=None, activation=a, residual=None, prenorm=False,
                  residual_in_fp32=False, eps=1e-5) for a in ("swish", "sigmoid", "gelu")]
    calls.append(dict(calls[0], x=torch.randn(2, 5, 9000), g=torch.randn(2, 5, 9000), weight=None))  # V > MAX_V
    for call in calls:
        key = ops._static_key(call, {})
        assert key is not None
        full = ops._decide(call, {})
        assert ops._decide(call, {}, key) == full  # computed and kept
        assert ops._VERDICTS.get(key) is not None
        assert ops._decide(call, {}, key) == full  # from the kept verdict
    assert not ops._decide(calls[2], {}, ops._static_key(calls[2], {}))[0]  # gelu: routed
    assert ops._static_key(calls[0], {"extra": 1}) is None
    assert ops._static_key(dict(calls[0], prenorm=1), {}) is None
    # bad input raises each time: nothing is kept for it
    bad = dict(calls[0], weight=torch.ones(7))
    for _ in range(2):
        with pytest.raises(ValueError, match="weight must be"):
            ops._decide(bad, {}, ops._static_key(bad, {}))
    # the per-call gates still run on a kept verdict
    key = ops._static_key(calls[0], {})
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "1")
    assert not ops._decide(calls[0], {}, key)[0]
    monkeypatch.delenv("KERNEL_FUN_DISABLE")
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert not ops._decide(calls[0], {}, key)[0]


def test_kept_verdicts_are_bounded(monkeypatch):
    from kernel_fun._common import gate

    monkeypatch.setattr(gate.Verdicts, "LIMIT", 8)
    for n in range(1, 30):
        x = torch.randn(n, 16)
        gnorm.rms_norm_gated(x, torch.randn(n, 16), None, None)
        assert len(ops._VERDICTS) <= 8


def test_under_torch_compile_ours_runs_with_one_break_and_no_recompile_on_T(compile_counts):
    """A compiled function around the op (CPU, interpreted): our kernels run forward and backward,
    the op is one graph break (it is kept out of traced graphs), and new values of T compile no
    new graph. The GPU tier compares the counts with fla's (tests/gnorm/test_gpu.py)."""
    w = torch.randn(32, requires_grad=True)
    inputs = [tuple(torch.randn(2, T, 3, 32, requires_grad=True) for _ in range(2)) for T in (5, 9, 17)]
    before = launches("gnorm.")
    counts = compile_counts(lambda x, g: gnorm.rms_norm_gated(x * 2.0, g, w, None, activation="swish") * 3.0,
                            inputs)
    assert launches("gnorm.") - before == 3 * 3  # fwd, bwd, dw_reduce for each T
    assert counts == (1, 2)
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x, _ in inputs)
