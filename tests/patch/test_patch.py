"""patch_fla(): which names it rebinds, idempotence, reversibility, the fallback still reaching
fla's own functions, drift, and modeling code that imports fla's ops itself (CPU)."""
import importlib
import logging
import types

import pytest

import kernel_fun
from kernel_fun import patch
from kernel_fun._common import compat

EXPECTED = {  # name an fla layer calls through -> our drop-in
    "fla.layers.kda.chunk_kda": "kernel_fun.kda:chunk_kda",
    "fla.modules.causal_conv1d.ops.causal_conv1d": "kernel_fun.cconv:causal_conv1d",
    "fla.layers.gated_deltanet.causal_conv1d": "kernel_fun.cconv:causal_conv1d",
    "fla.modules.norm.fused_norm_gate.rms_norm_gated": "kernel_fun.gnorm:rms_norm_gated",
    "fla.layers.gated_deltanet.chunk_gated_delta_rule": "kernel_fun.gdn:chunk_gated_delta_rule",
}


def _get(dotted):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _ours(spec):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(autouse=True)
def _unpatched(clean_state):
    kernel_fun.unpatch_fla()
    before = {k: _get(k) for k in EXPECTED}
    yield before
    kernel_fun.unpatch_fla()
    assert {k: _get(k) for k in EXPECTED} == before


def test_patch_rebinds_the_layers_names_and_unpatch_restores_them(_unpatched, caplog):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    done = kernel_fun.patch_fla()
    assert set(EXPECTED) <= set(done)
    for name, spec in EXPECTED.items():
        assert _get(name) is _ours(spec), name
    assert "kernel-fun patch_fla: routed" in caplog.text
    # fla's own functions are untouched: the public entries our fallbacks call
    import fla.modules.causal_conv1d
    import fla.ops.kda

    assert fla.ops.kda.chunk_kda is _unpatched["fla.layers.kda.chunk_kda"]
    assert fla.modules.causal_conv1d.causal_conv1d is _unpatched["fla.modules.causal_conv1d.ops.causal_conv1d"]
    restored = kernel_fun.unpatch_fla()
    assert set(restored) == set(done)
    assert {k: _get(k) for k in EXPECTED} == _unpatched


def test_patch_is_idempotent():
    first = kernel_fun.patch_fla()
    assert first and kernel_fun.patch_fla() == []
    for name, spec in EXPECTED.items():
        assert _get(name) is _ours(spec)
    assert len(kernel_fun.unpatch_fla()) == len(first)


def test_context_manager_restores(_unpatched):
    with kernel_fun.patched_fla() as done:
        assert set(EXPECTED) <= set(done)
        assert _get("fla.layers.kda.chunk_kda") is _ours(EXPECTED["fla.layers.kda.chunk_kda"])
    assert {k: _get(k) for k in EXPECTED} == _unpatched
    assert not patch.is_patched()


def test_fallback_reaches_fla_not_ourselves_while_patched():
    """Every fla symbol a family calls resolves to fla's object, never to one of ours, with the
    patch on (a fallback that resolved to our drop-in would recurse forever)."""
    kernel_fun.patch_fla()
    for call in compat.FLA_CALLS:
        obj = compat.fla_symbol(call.module, call.symbol)
        assert not getattr(obj, "__module__", "").startswith("kernel_fun"), (call, obj)


def test_a_name_someone_else_rebound_is_left_alone(caplog):
    import fla.layers.kda as layer

    def theirs(*a, **k):
        return None

    saved, layer.chunk_kda = layer.chunk_kda, theirs
    try:
        caplog.set_level(logging.WARNING, logger="kernel_fun")
        done = kernel_fun.patch_fla()
        assert "fla.layers.kda.chunk_kda" not in done and layer.chunk_kda is theirs
        assert "is not fla's" in caplog.text
    finally:
        layer.chunk_kda = saved


def test_drift_in_a_target_raises_unless_fallback(monkeypatch):
    import fla.layers.kda as layer

    saved = layer.chunk_kda  # restored by hand: clean_state's monkeypatch is torn down last
    del layer.chunk_kda
    try:
        with pytest.raises(compat.FlaDriftError, match="fla.layers.kda.chunk_kda"):
            kernel_fun.patch_fla()
        assert not patch.is_patched()  # refused whole: nothing half-patched
        monkeypatch.setenv("KERNEL_FUN_FALLBACK", "1")
        done = kernel_fun.patch_fla()
        assert "fla.layers.kda.chunk_kda" not in done and "fla.layers.gated_deltanet.causal_conv1d" in done
    finally:
        layer.chunk_kda = saved


def test_modeling_code_that_imports_fla_ops_itself():
    """The pattern for a model file doing ``from fla.ops.kda import chunk_kda``: name its module."""
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.ops.kda import chunk_kda

    model_file = types.ModuleType("my_modeling_kda")
    model_file.chunk_kda = chunk_kda
    model_file.rms_norm_gated = rms_norm_gated
    model_file.unrelated = len
    done = kernel_fun.patch_fla(modules=[model_file])
    assert {"my_modeling_kda.chunk_kda", "my_modeling_kda.rms_norm_gated"} <= set(done)
    assert model_file.chunk_kda is _ours("kernel_fun.kda:chunk_kda")
    assert model_file.rms_norm_gated is _ours("kernel_fun.gnorm:rms_norm_gated")
    assert model_file.unrelated is len
    kernel_fun.unpatch_fla()
    assert model_file.chunk_kda is chunk_kda and model_file.rms_norm_gated is rms_norm_gated
