"""kda's public entry: classification, routing with reasons, bad input (CPU; fla's kernels do
not interpret, so routed calls reach a recorder in place of fla's chunk_kda)."""
import logging

import pytest
import torch

from kernel_fun import kda
from kernel_fun._common import compat
from kernel_fun._common.classify import signature_problems
from kernel_fun._common.witness import launch_counts
from kernel_fun.kda import ops


@pytest.fixture(autouse=True)
def _clean(clean_state):
    yield


@pytest.fixture
def fla_calls(fla_recorder):
    """Routed calls reach a recorder in place of fla's entry."""
    return fla_recorder(ops, ("fla-o", None))


def _inputs(B=1, T=70, H=2, HV=4, K=128, V=128, dtype=torch.float16):
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = torch.randn(B, T, H, K, dtype=dtype)
    v = torch.randn(B, T, HV, V, dtype=dtype)
    g = torch.randn(B, T, HV, K, dtype=dtype)
    beta = torch.rand(B, T, HV, dtype=dtype)
    return q, k, v, g, beta


def test_signature_matches_installed_fla():
    fla_fn = compat.fla_symbol("fla.ops.kda", "chunk_kda")
    assert signature_problems(ops.chunk_kda, fla_fn, ops.RULES) == []
    assert signature_problems(ops.is_supported, fla_fn, ops.RULES) == []


def test_fla_kwargs_read_by_chunk_kda_are_classified():
    # fla reads these from **kwargs; each has a rule (A_log, dt_bias ours; the rest route)
    import inspect

    src = inspect.getsource(compat.fla_symbol("fla.ops.kda", "chunk_kda"))
    import re

    read = set(re.findall(r"kwargs(?:\.get|\.pop)\(\s*['\"](\w+)['\"]", src))
    read |= set(re.findall(r"['\"](\w+)['\"] in kwargs", src))
    assert read and read <= set(ops.RULES), read - set(ops.RULES)


def test_production_call_is_in_the_box():
    q, k, v, g, beta = _inputs()
    ok, reason = kda.is_supported(q, k, v, g, beta, A_log=torch.randn(4), dt_bias=torch.randn(4 * 128),
                                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True)
    assert ok, reason


@pytest.mark.parametrize("kwargs,needle", [
    (dict(safe_gate=True, lower_bound=-5.0), "safe_gate"),
    (dict(lower_bound=-5.0), "lower_bound"),
    (dict(disable_recompute=True), "disable_recompute"),
    (dict(return_intermediate_states=True), "return_intermediate_states"),
    (dict(cp_context="CP"), "cp_context"),
    (dict(use_graph=True), "use_graph"),
    (dict(chunk_size=32), "chunk_size=32"),
    (dict(state_v_first=True, transpose_state_layout=True), "both state_v_first and transpose_state_layout"),
    (dict(mystery=1), "'mystery' is not classified"),
])
def test_routed_arguments_fall_back_with_reason(fla_calls, caplog, kwargs, needle):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    q, k, v, g, beta = _inputs()
    ok, reason = kda.is_supported(q, k, v, g, beta, **kwargs)
    assert not ok and needle in reason
    assert kda.chunk_kda(q, k, v, g, beta, **kwargs) == ("fla-o", None)
    for key, val in kwargs.items():
        assert fla_calls[-1][key] == val
    assert f"kernel-fun kda: falling back to fla: {reason}" in caplog.text


@pytest.mark.parametrize("change,needle", [
    (dict(dtype=torch.float32), "dtype torch.float32"),
    (dict(K=96), "K=96"),
    (dict(V=32), "V=32"),
])
def test_box_limits_route(fla_calls, change, needle):
    ok, reason = kda.is_supported(*_inputs(**change))
    assert not ok and needle in reason


def test_bad_shapes_raise():
    q, k, v, g, beta = _inputs()
    with pytest.raises(ValueError, match="multiple of H"):
        kda.chunk_kda(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="g must be"):
        kda.chunk_kda(q, k, v, g[..., :32], beta)
    with pytest.raises(ValueError, match="initial_state"):
        kda.chunk_kda(q, k, v, g, beta, initial_state=torch.zeros(2, 4, 64, 64))
    with pytest.raises(ValueError, match="end at T"):
        kda.chunk_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 30, 60]))


def test_switch_routes(fla_calls, monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_KDA_DISABLE", "1")
    assert kda.chunk_kda(*_inputs())[0] == "fla-o"


@pytest.mark.parametrize("change", [
    dict(cu_seqlens=torch.tensor([0, 30, 70])),
    dict(initial_state=torch.zeros(1, 4, 128, 128)),
    dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    dict(use_gate_in_kernel=False, A_log=None, dt_bias=None),
], ids=["cu_seqlens", "initial_state", "beta_sigmoid", "precomputed_gate"])
def test_every_path_of_the_box_runs_ours(change):
    """Packed documents, an initial state, beta through the sigmoid, a precomputed gate and
    K, V other than 128 are ours (each passed the GPU chain test against the fp64 recurrence
    on the H200, 2026-11-30), not routed to fla."""
    q, k, v, g, beta = _inputs()
    kw = dict(dict(A_log=torch.randn(4), dt_bias=torch.randn(4 * 128), use_gate_in_kernel=True), **change)
    assert kda.is_supported(q, k, v, g, beta, **kw) == (True, "")
    for K, V in ((64, 64), (64, 256), (128, 64)):
        ok, reason = kda.is_supported(*_inputs(K=K, V=V), A_log=torch.randn(4), dt_bias=torch.randn(4 * K),
                                      use_gate_in_kernel=True)
        assert ok, (K, V, reason)


def test_layer_call_with_state_v_first_is_in_the_box():
    """The exact flags fla 0.6.0's KimiDeltaAttention passes in training and prefill."""
    q, k, v, g, beta = _inputs()
    kw = dict(A_log=torch.randn(4), dt_bias=torch.randn(4 * 128), use_qk_l2norm_in_kernel=True,
              use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False,
              safe_gate=False, lower_bound=None, state_v_first=True, cu_seqlens=None)
    assert kda.is_supported(q, k, v, g, beta, initial_state=None, output_final_state=False, **kw) == (True, "")
    h0 = torch.zeros(1, 4, 128, 128)  # [N, HV, V, K]
    assert kda.is_supported(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw) == (True, "")


GATE = dict(use_gate_in_kernel=True, A_log=torch.randn(4), dt_bias=torch.randn(4 * 128))


@pytest.mark.parametrize("name,change,needle", [
    ("g", dict(g=torch.ones(1, 70, 4, 128, dtype=torch.int64)), "g must be a floating-point tensor"),
    ("beta", dict(beta=torch.ones(1, 70, 4, dtype=torch.int64)), "beta must be a floating-point tensor"),
    ("q", dict(q=torch.ones(1, 70, 2, 128, dtype=torch.int32)), "q must be a floating-point tensor"),
    ("A_log_len", dict(A_log=torch.randn(2)), r"A_log must have HV=4 elements, got shape \(2,\)"),
    ("A_log_int", dict(A_log=torch.ones(4, dtype=torch.int64)), "A_log must be a floating-point tensor"),
    ("dt_bias_len", dict(dt_bias=torch.randn(128)), r"dt_bias must have HV\*K=512 elements, got shape \(128,\)"),
    ("T0", dict(T=0), "empty input"),
    ("H0", dict(H=0), "empty input"),
])
def test_bad_input_raises_before_any_launch(fla_calls, name, change, needle):
    shape = {k: change.pop(k) for k in ("T", "H") if k in change}
    q, k, v, g, beta = _inputs(**shape) if "H" not in shape else _inputs(H=0, HV=0)
    t = dict(q=q, k=k, v=v, g=g, beta=beta, **GATE)
    t.update(change)
    if "q" in change:
        t["k"] = change["q"]
    before = launch_counts()
    with pytest.raises(ValueError, match=needle):
        kda.chunk_kda(t.pop("q"), t.pop("k"), t.pop("v"), t.pop("g"), t.pop("beta"), **t)
    assert launch_counts() == before and not fla_calls
