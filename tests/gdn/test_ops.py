"""gdn's public entry: classification, routing with reasons, bad input, the note on fla's own
Hopper backward refusal (CPU; fla's kernels do not interpret, so routed calls reach a recorder
in place of fla's chunk_gated_delta_rule)."""
import inspect
import logging
import re

import pytest
import torch

from kernel_fun import gdn
from kernel_fun._common import compat, hardware
from kernel_fun._common.classify import signature_problems
from kernel_fun._common.witness import launch_counts
from kernel_fun.gdn import ops


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
    g = torch.randn(B, T, HV, dtype=dtype)
    beta = torch.rand(B, T, HV, dtype=dtype)
    return q, k, v, g, beta


GATE = dict(use_gate_in_kernel=True, A_log=torch.randn(4), dt_bias=torch.randn(4))
LAYER = dict(GATE, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False,
             state_v_first=True, cu_seqlens=None)


def test_signature_matches_installed_fla():
    fla_fn = compat.fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    assert signature_problems(ops.chunk_gated_delta_rule, fla_fn, ops.RULES) == []
    assert signature_problems(ops.is_supported, fla_fn, ops.RULES) == []


def test_fla_kwargs_read_by_the_op_are_classified():
    # fla reads these from **kwargs (its public function and its gate path); each has a rule
    src = inspect.getsource(inspect.unwrap(compat.fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")))
    read = set(re.findall(r"kwargs(?:\.get|\.pop)\(\s*['\"](\w+)['\"]", src))
    read |= set(re.findall(r"['\"](\w+)['\"] in kwargs", src))
    assert {"use_gate_in_kernel", "A_log", "dt_bias", "chunk_size", "transpose_state_layout"} <= read
    assert read <= set(ops.RULES), read - set(ops.RULES)


def test_layer_call_is_in_the_box():
    """The exact flags fla 0.6.0's GatedDeltaNet passes in training and prefill."""
    q, k, v, g, beta = _inputs()
    assert gdn.is_supported(q, k, v, g, beta, initial_state=None, output_final_state=False, **LAYER) == (True, "")
    h0 = torch.zeros(1, 4, 128, 128)  # [N, HV, V, K]
    assert gdn.is_supported(q, k, v, g, beta, initial_state=h0, output_final_state=True, **LAYER) == (True, "")


@pytest.mark.parametrize("change", [
    dict(cu_seqlens=torch.tensor([0, 30, 31, 70])),
    dict(initial_state=torch.zeros(1, 4, 128, 128), state_v_first=False),
    dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    dict(use_gate_in_kernel=False, A_log=None, dt_bias=None),
    dict(dt_bias=None),
    dict(scale=0.3),
], ids=["cu_seqlens", "initial_state_kfirst", "beta_sigmoid_negeig", "precomputed_gate", "no_dt_bias", "scale"])
def test_every_path_of_the_box_is_ours(change):
    q, k, v, g, beta = _inputs()
    kw = {k_: v_ for k_, v_ in dict(GATE, **change).items() if v_ is not None or k_ in ("cu_seqlens",)}
    assert gdn.is_supported(q, k, v, g, beta, **kw) == (True, "")
    for K, V in ((64, 64), (64, 256), (128, 64), (128, 256), (256, 512), (128, 512), (256, 128)):
        assert gdn.is_supported(*_inputs(K=K, V=V), **GATE) == (True, ""), (K, V)
    assert gdn.is_supported(*_inputs(dtype=torch.bfloat16), **GATE) == (True, "")
    assert gdn.is_supported(*_inputs(T=1), **GATE) == (True, "")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(cp_context="CP"), "cp_context"),
    (dict(chunk_size=32), "chunk_size=32"),
    (dict(state_v_first=True, transpose_state_layout=True), "both state_v_first and transpose_state_layout"),
    (dict(head_first=False), "head_first"),
    (dict(mystery=1), "'mystery' is not classified"),
    (dict(allow_neg_eigval=True), "allow_neg_eigval without use_beta_sigmoid_in_kernel"),
    (dict(use_gate_in_kernel=True), "use_gate_in_kernel without A_log"),
    (dict(initial_state=torch.zeros(1, 4, 128, 128, dtype=torch.bfloat16)), "initial_state dtype"),
    (dict(cu_seqlens=torch.tensor([0, 70]), q_batch=2), "batch size 2"),
])
def test_routed_arguments_fall_back_with_reason(fla_calls, caplog, kwargs, needle):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    B = kwargs.pop("q_batch", 1)
    q, k, v, g, beta = _inputs(B=B)
    if B > 1:
        kwargs["cu_seqlens"] = torch.tensor([0, 70, 140])
    ok, reason = gdn.is_supported(q, k, v, g, beta, **kwargs)
    assert not ok and needle in reason, reason
    assert gdn.chunk_gated_delta_rule(q, k, v, g, beta, **kwargs) == ("fla-o", None)
    for key, val in kwargs.items():
        assert fla_calls[-1][key] is val or fla_calls[-1][key] == val
    assert f"kernel-fun gdn: falling back to fla: {reason}" in caplog.text


@pytest.mark.parametrize("change,needle", [
    (dict(dtype=torch.float32), "dtype torch.float32"),
    (dict(K=96), "K=96"),
    (dict(K=32), "K=32"),
    (dict(V=32), "V=32"),
    (dict(V=1024), "V=1024"),
])
def test_box_limits_route(fla_calls, change, needle):
    ok, reason = gdn.is_supported(*_inputs(**change), **GATE)
    assert not ok and needle in reason


def test_switches_route(fla_calls, monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_GDN_DISABLE", "1")
    assert gdn.chunk_gated_delta_rule(*_inputs(), **GATE)[0] == "fla-o"
    monkeypatch.delenv("KERNEL_FUN_GDN_DISABLE")
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "1")
    ok, reason = gdn.is_supported(*_inputs(), **GATE)
    assert not ok and "KERNEL_FUN_DISABLE" in reason


@pytest.mark.parametrize("name,change,needle", [
    ("g_int", dict(g=torch.ones(1, 70, 4, dtype=torch.int64)), "g must be a floating-point tensor"),
    ("g_shape", dict(g=torch.randn(1, 70, 4, 128)), r"g and beta must be \[B, T, HV\]"),
    ("beta_int", dict(beta=torch.ones(1, 70, 4, dtype=torch.int64)), "beta must be a floating-point tensor"),
    ("q_int", dict(q=torch.ones(1, 70, 2, 128, dtype=torch.int32)), "q must be a floating-point tensor"),
    ("k_heads", dict(k=torch.randn(1, 70, 4, 128, dtype=torch.float16)), "disagree"),
    ("groups", dict(v=torch.randn(1, 70, 3, 128, dtype=torch.float16), g=torch.randn(1, 70, 3),
                    beta=torch.rand(1, 70, 3), A_log=torch.randn(3), dt_bias=torch.randn(3)), "multiple of H"),
    ("A_log_len", dict(A_log=torch.randn(2)), r"A_log must have HV=4 elements, got shape \(2,\)"),
    ("A_log_int", dict(A_log=torch.ones(4, dtype=torch.int64)), "A_log must be a floating-point tensor"),
    ("dt_bias_len", dict(dt_bias=torch.randn(4 * 128)), r"dt_bias must have HV=4 elements"),
    ("h0_shape", dict(initial_state=torch.zeros(2, 4, 128, 128)), "initial_state must be"),
    ("cu_end", dict(cu_seqlens=torch.tensor([0, 30, 60])), "end at T"),
    ("cu_start", dict(cu_seqlens=torch.tensor([1, 30, 70])), "start at 0"),
    ("T0", dict(T=0), "empty input"),
])
def test_bad_input_raises_before_any_launch(fla_calls, name, change, needle):
    shape = {k_: change.pop(k_) for k_ in ("T",) if k_ in change}
    q, k, v, g, beta = _inputs(**shape)
    t = dict(q=q, k=k, v=v, g=g, beta=beta, **GATE)
    t.update(change)
    before = launch_counts()
    with pytest.raises(ValueError, match=needle):
        gdn.chunk_gated_delta_rule(t.pop("q"), t.pop("k"), t.pop("v"), t.pop("g"), t.pop("beta"), **t)
    assert launch_counts() == before and not fla_calls


def test_note_fla_refuses_backward_on_hopper_with_triton_below_3_7_1(monkeypatch):
    monkeypatch.setattr(hardware, "_read_capability", lambda index: (9, 0))
    hardware.reset_probes()
    try:
        # a CPU tensor that reports cuda:0 (the probe reads only .device and the capability)
        monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)), raising=False)
        q = torch.randn(1, 4, 1, 64)
        for ver, refused in (((3, 6, 0), True), ((3, 4, 0), True), ((3, 7, 0), True), ((3, 7, 1), False),
                             ((3, 3, 1), False), ((3, 9, 0), False)):
            monkeypatch.setattr(hardware, "triton_version", lambda v=ver: v)
            note = ops.fla_refuses_backward(q)
            assert (note is not None) == refused, ver
            if refused:
                assert "refuses this call's backward" in note and "fla #640" in note
        monkeypatch.setattr(hardware, "_read_capability", lambda index: (10, 0))
        hardware.reset_probes()
        monkeypatch.setattr(hardware, "triton_version", lambda: (3, 6, 0))
        assert ops.fla_refuses_backward(q) is None  # Blackwell: fla trains
    finally:
        hardware.reset_probes()


def test_routed_training_call_carries_the_note(fla_calls, monkeypatch):
    """A call routed to fla that needs gradients says, on Hopper with Triton < 3.7.1, that fla's
    backward will refuse it; an inference call (no gradients) does not."""
    monkeypatch.setattr(ops, "fla_refuses_backward", lambda q: "fla 0.6.0 itself refuses this call's backward")
    q, k, v, g, beta = _inputs(K=96)
    ok, reason = gdn.is_supported(q, k, v, g, beta, **GATE)
    assert not ok and "note" not in reason
    q.requires_grad_(True)
    ok, reason = gdn.is_supported(q, k, v, g, beta, **GATE)
    assert not ok and reason.startswith("K=96") and "note: fla 0.6.0 itself refuses this call's backward" in reason
    with torch.no_grad():
        assert "note" not in gdn.is_supported(q, k, v, g, beta, **GATE)[1]


def test_bench_adds_the_flashqla_cases_only_where_flash_qla_imports(monkeypatch):
    """Issue 17's FlashQLA rows: `bench --family gdn` lists them when `flash_qla` is importable
    (the case's baseline column is FlashQLA) and leaves them out, not failing, where it is not."""
    import importlib.util

    from kernel_fun.bench import gdn as bench_gdn

    real = importlib.util.find_spec
    rows = {"prod_b8_vs_flashqla", "grouped_h16_hv32_b4_vs_flashqla"}
    for present in (False, True):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda n, *a, p=present: (object() if p else None) if n == "flash_qla" else real(n, *a))
        names = {n for n, _ in bench_gdn.cases()}
        assert (rows <= names) if present else not (rows & names), (present, names)
        assert {"prod_b8", "grouped_h16_hv32_b4", "varlen_16docs", "latency_b1_t4096", "fla_default_heads_b8"} <= names


def test_calls_fla_hands_to_flashqla_stay_with_fla(monkeypatch, fla_calls):
    """Where FlashQLA is installed fla's own dispatch hands it the calls it supports (the
    precomputed gate, beta activated, K = V = 128): those stay with fla, the reason says so and how
    to give them to us (FLA_FLASH_QLA=0). fla's real registry and verifier, FlashQLA made
    available, its hardware check passed."""
    from fla.ops.gated_delta_rule.backends.flash_qla import FlashQLABackend

    verifier = FlashQLABackend.chunk_gated_delta_rule_verifier
    monkeypatch.setattr(FlashQLABackend, "is_available", classmethod(lambda cls: True))
    monkeypatch.setattr("fla.ops.gated_delta_rule.backends.flash_qla.IS_NVIDIA_HOPPER", True)
    q, k, v, g, beta = _inputs()
    g = -torch.rand_like(g)
    pre = dict(use_qk_l2norm_in_kernel=True, state_v_first=True)
    ok, reason = gdn.is_supported(q, k, v, g, beta, **pre)
    assert not ok and "flash_qla backend" in reason and "FLA_FLASH_QLA=0" in reason, reason
    assert FlashQLABackend.chunk_gated_delta_rule_verifier is verifier
    o, _ = gdn.chunk_gated_delta_rule(q, k, v, g, beta, **pre)
    assert o == "fla-o" and len(fla_calls) == 1
    # what FlashQLA refuses stays ours: the layer's call (gate and sigmoid in the op), K = 64
    assert gdn.is_supported(q, k, v, g, beta, **LAYER) == (True, "")
    q64, k64 = q[..., :64].contiguous(), k[..., :64].contiguous()
    assert gdn.is_supported(q64, k64, v, g, beta, **pre) == (True, "")
    monkeypatch.setenv("FLA_FLASH_QLA", "0")
    assert gdn.is_supported(q, k, v, g, beta, **pre) == (True, "")


def test_fla_backend_walk(monkeypatch):
    """compat.fla_backend_taking walks fla's registry as fla's dispatch does: by priority, skipping
    the unavailable, the disabled and the refusing; a registry of another shape routes to fla."""
    import fla.backends

    class Backend:
        def __init__(self, name, available=True, enabled=True, accepts=True, env="FLA_X", impl=True):
            self.backend_type, self.env_var = name, env
            self._a, self._e, self._v, self._i = available, enabled, accepts, impl

        def is_available(self):
            return self._a

        def is_enabled(self):
            return self._e

        def verify(self, function, **arguments):
            assert function == "f" and arguments == {"q": 1}
            return self._v, None

        def get_implementation(self, function):
            return (lambda: None) if self._i else None

    class Registry:
        def __init__(self, backends):
            self.backends = backends

        def _get_sorted_backends(self):
            return self.backends

    def walk(*backends):
        monkeypatch.setattr(fla.backends, "_load_operation_registry", lambda operation: Registry(list(backends)))
        return compat.fla_backend_taking("op", "f", {"q": 1})

    assert walk() is None
    assert walk(Backend("a", available=False), Backend("b", enabled=False), Backend("c", accepts=False),
                Backend("d", impl=False)) is None
    assert walk(Backend("a", accepts=False), Backend("b", env="FLA_B"), Backend("c")) == ("b", "FLA_B")
    monkeypatch.setattr(fla.backends, "_load_operation_registry", lambda operation: object())
    name, env = compat.fla_backend_taking("op", "f", {"q": 1})
    assert name.startswith("unknown: fla's backend registry changed") and env == ""
    monkeypatch.setattr(fla.backends, "_DISPATCH_DISABLED", True)
    assert compat.fla_backend_taking("op", "f", {"q": 1}) is None


def test_kept_verdicts_answer_as_the_full_checks(monkeypatch):
    """A call whose static key (``frontend.static_key``) was seen skips the classification and the
    box (kda's entry keeps them the same way); packed calls and bad input run them every time; the
    per-call gates (switches, fla's backend dispatch, capture) still apply to a kept verdict."""
    from kernel_fun._common import capture
    from kernel_fun._delta import frontend

    boxes = []
    real_box = frontend.box
    monkeypatch.setattr(frontend, "box", lambda *a, **k: (boxes.append(1), real_box(*a, **k))[1])
    q, k, v, g, beta = _inputs()
    for _ in range(3):
        assert gdn.is_supported(q, k, v, g, beta, **LAYER) == (True, "")
    assert len(boxes) == 1
    assert gdn.is_supported(*_inputs(T=71), **LAYER) == (True, "") and len(boxes) == 2  # a new shape
    for _ in range(2):  # routed by the box: kept too, same answer
        ok, reason = gdn.is_supported(*_inputs(K=96), **LAYER)
        assert not ok and "K=96" in reason
    assert len(boxes) == 3
    cu = torch.tensor([0, 30, 70])
    for _ in range(2):  # packed: the box reads cu_seqlens' values, so nothing is kept
        assert gdn.is_supported(q, k, v, g, beta, **dict(LAYER, cu_seqlens=cu)) == (True, "")
    assert len(boxes) == 5
    for _ in range(2):  # bad input raises every time
        with pytest.raises(ValueError, match="A_log must have"):
            gdn.is_supported(q, k, v, g, beta, **dict(LAYER, A_log=torch.randn(3)))
    assert frontend.static_key(dict(q=q, scale=object()), {}) is None
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "1")
    assert not gdn.is_supported(q, k, v, g, beta, **LAYER)[0]
    monkeypatch.delenv("KERNEL_FUN_DISABLE")
    monkeypatch.setattr(ops, "fla_backend_taking", lambda *a: ("flash_qla", "FLA_FLASH_QLA"))
    ok, reason = gdn.is_supported(q, k, v, g, beta, **LAYER)
    assert not ok and "flash_qla backend" in reason
    monkeypatch.undo()
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert not gdn.is_supported(q, k, v, g, beta, **LAYER)[0]
