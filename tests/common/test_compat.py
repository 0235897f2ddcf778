"""The fla drift check: moved symbols, renamed keywords, changed kernel arguments, versions."""
import inspect
import warnings

import pytest

from kernel_fun._common import compat, gate


@pytest.fixture(autouse=True)
def _reset(monkeypatch):
    monkeypatch.delenv("KERNEL_FUN_FALLBACK", raising=False)
    compat.reset()
    yield
    compat.reset()


def test_installed_fla_has_no_drift():
    st = compat.check_fla(refresh=True)
    assert st.version == "0.6.0" and st.tested and st.problems == []
    assert compat.drift_gate() == (True, "")


def test_every_listed_symbol_resolves():
    for call in compat.FLA_CALLS:
        assert compat.fla_symbol(call.module, call.symbol) is not None


def test_unlisted_symbol_is_refused():
    with pytest.raises(KeyError, match="not listed"):
        compat.fla_symbol("fla.ops.kda", "fused_recurrent_kda")


def test_missing_symbol_raises_naming_it(monkeypatch):
    import fla.ops.kda

    monkeypatch.delattr(fla.ops.kda, "chunk_kda")
    with pytest.raises(compat.FlaDriftError, match=r"fla\.ops\.kda\.chunk_kda: symbol missing"):
        compat.check_fla(refresh=True)


def test_renamed_keyword_raises_naming_it(monkeypatch):
    import fla.modules.causal_conv1d as mod

    def causal_conv1d(x, weight=None, bias=None, residual=None, initial_state=None,
                      output_final_state=False, activation=None, backend="triton",
                      seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kw):
        pass

    monkeypatch.setattr(mod, "causal_conv1d", causal_conv1d)
    with pytest.raises(compat.FlaDriftError, match="keyword 'cu_seqlens' missing"):
        compat.check_fla(refresh=True)


def test_fallback_switch_turns_drift_into_warning_and_routing(monkeypatch):
    import fla.ops.kda

    monkeypatch.delattr(fla.ops.kda, "chunk_kda")
    monkeypatch.setenv("KERNEL_FUN_FALLBACK", "1")
    with pytest.warns(RuntimeWarning, match="chunk_kda"):
        ok, reason = compat.drift_gate()
    assert not ok and "chunk_kda" in reason
    # the families see it through decide()
    ok, reason = gate.decide("kda")
    assert not ok and "fla drift" in reason
    # the switch is read per call: without it the same cached drift raises
    monkeypatch.delenv("KERNEL_FUN_FALLBACK")
    with pytest.raises(compat.FlaDriftError):
        gate.decide("kda")


def test_untested_version_warns_once(monkeypatch):
    monkeypatch.setattr(compat, "_fla_version", lambda: "0.6.9")
    with pytest.warns(RuntimeWarning, match="0.6.9"):
        compat.check_fla(refresh=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_fla()


def test_fla_missing_is_an_import_error_with_the_install_line(monkeypatch):
    monkeypatch.setattr(compat, "_fla_version", lambda: None)
    with pytest.raises(ImportError, match="pip install 'fla-core"):
        compat.check_fla(refresh=True)


def test_listed_keywords_match_the_signature_as_data():
    # Each entry names only keywords fla has today (guards typos in the table itself).
    for call in compat.FLA_CALLS:
        if call.keywords:
            params = inspect.signature(compat.fla_symbol(call.module, call.symbol)).parameters
            assert set(call.keywords) <= set(params), call
