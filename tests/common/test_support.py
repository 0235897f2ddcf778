"""The gates of the call contract: switches, probes, tensor and capture gates, logging, decide."""
import logging
import warnings

import pytest
import torch

from kernel_fun._common import capture, gate, hardware, report, switches


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith("KERNEL_FUN_"):
            monkeypatch.delenv(k)
    switches._warned.clear()
    hardware.reset_probes()
    capture.reset_warm()
    report.reset_logged()
    yield
    hardware.reset_probes()
    capture.reset_warm()
    report.reset_logged()


# ----------------------------------------------------------------------------- switches
def test_disable_switches_are_read_per_call(monkeypatch):
    assert switches.disabled_reason("kda") is None
    monkeypatch.setenv("KERNEL_FUN_KDA_DISABLE", "1")
    assert switches.disabled_reason("kda") == "disabled by KERNEL_FUN_KDA_DISABLE=1"
    assert switches.disabled_reason("cconv") is None
    monkeypatch.setenv("KERNEL_FUN_KDA_DISABLE", "0")
    assert switches.disabled_reason("kda") is None
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "true")
    assert switches.disabled_reason("cconv") == "disabled by KERNEL_FUN_DISABLE=1"
    monkeypatch.delenv("KERNEL_FUN_DISABLE")
    assert switches.disabled_reason("cconv") is None


def test_malformed_flag_warns_once_and_uses_default(monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_DISABLE", "yes please")
    with pytest.warns(RuntimeWarning, match="KERNEL_FUN_DISABLE"):
        assert switches.disabled_reason("kda") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert switches.disabled_reason("kda") is None  # second time: no warning


def test_min_ctas_parsing(monkeypatch):
    assert switches.min_ctas("kda", 64) == 64
    monkeypatch.setenv("KERNEL_FUN_KDA_MIN_CTAS", "128")
    assert switches.min_ctas("kda", 64) == 128
    monkeypatch.setenv("KERNEL_FUN_KDA_MIN_CTAS", "12x")
    with pytest.warns(RuntimeWarning, match="KERNEL_FUN_KDA_MIN_CTAS"):
        assert switches.min_ctas("kda", 64) == 64
    monkeypatch.setenv("KERNEL_FUN_KDA_MIN_CTAS", "-3")
    with pytest.warns(RuntimeWarning):
        assert switches.min_ctas("kda", 64) == 64


def test_debug_and_fallback_flags(monkeypatch):
    assert not switches.debug() and not switches.fallback_on_drift()
    monkeypatch.setenv("KERNEL_FUN_DEBUG", "1")
    monkeypatch.setenv("KERNEL_FUN_FALLBACK", "ON")
    assert switches.debug() and switches.fallback_on_drift()


def test_unknown_family_switch_is_ignored(monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_KDAA_DISABLE", "1")
    monkeypatch.setenv("KERNEL_FUN_CCONV_TMA", "0")  # known
    assert switches.disabled_reason("kda") is None
    assert switches.unknown_variables() == ["KERNEL_FUN_KDAA_DISABLE"]


def test_cconv_tma_switch(monkeypatch):
    assert switches.cconv_tma()  # default on
    monkeypatch.setenv("KERNEL_FUN_CCONV_TMA", "off")
    assert not switches.cconv_tma()
    monkeypatch.setenv("KERNEL_FUN_CCONV_TMA", "maybe")
    with pytest.warns(RuntimeWarning, match="KERNEL_FUN_CCONV_TMA"):
        assert switches.cconv_tma()  # malformed: the default


# ----------------------------------------------------------------------------- probes
@pytest.mark.parametrize("cap,ok", [((9, 0), True), ((10, 0), True), ((10, 3), True),
                                    ((8, 0), False), ((8, 9), False), ((12, 0), False)])
def test_device_gate_by_capability(monkeypatch, cap, ok):
    monkeypatch.setattr(hardware, "_read_capability", lambda index: cap)
    got, reason = hardware.device_gate(0)
    assert got is ok
    if not ok:
        assert f"sm{cap[0]}{cap[1]}" in reason


@pytest.mark.parametrize("cap", [(9, 0), (10, 0), (10, 3)])
@pytest.mark.parametrize("ver", [(3, 6, 0), (3, 7, 1), (3, 8, 0), (3, 9, 0)])
def test_blackwell_needs_triton_3_8_for_the_dot_families(monkeypatch, cap, ver):
    """kda and gdn (tl.dot recurrences) route to fla on Blackwell below Triton 3.8, with the Triton issues
    in the reason; cconv and gnorm, and every family on Hopper, are not held back."""
    monkeypatch.setattr(hardware, "_read_capability", lambda index: cap)
    monkeypatch.setattr(hardware, "triton_version", lambda: ver)
    hardware.reset_probes()
    held = cap[0] == 10 and ver < (3, 8, 0)
    for family in ("kda", "gdn", "cconv", "gnorm", None):
        ok, reason = hardware._cuda_gate(0, family)  # what the tensor gate and doctor's machine gate ask
        assert ok is not (held and family in hardware.DOT_FAMILIES), (family, reason)
        if not ok:
            assert f"sm{cap[0]}{cap[1]}" in reason and "3.8" in reason and "#10590" in reason
    hardware.reset_probes()


def test_triton_version_drops_local_and_prerelease_tags(monkeypatch):
    import triton

    for text, want in (("3.6.0", (3, 6, 0)), ("3.8.0+git1a2b3c", (3, 8, 0)), ("3.9.0rc1", (3, 9, 0)),
                       ("3.10", (3, 10, 0)), ("3.8.0.post1", (3, 8, 0))):
        monkeypatch.setattr(triton, "__version__", text)
        hardware.triton_version.cache_clear()
        assert hardware.triton_version() == want, text
    hardware.triton_version.cache_clear()


def test_probe_is_cached_and_resettable(monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, "_read_capability", lambda index: calls.append(index) or (9, 0))
    hardware.device_gate(0)
    hardware.device_gate(0)
    assert calls == [0]
    hardware.reset_probes()
    hardware.device_gate(0)
    assert calls == [0, 0]


def test_cpu_tensor_needs_interpreter(monkeypatch):
    x = torch.zeros(2)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert hardware.tensor_gate(x) == (False, "not a CUDA tensor")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert hardware.tensor_gate(x) == (True, "")
    assert hardware.tensor_gate(x, None) == (True, "")


def test_tensors_on_two_devices_refused():
    a, b = torch.zeros(1), torch.zeros(1, device="meta")
    ok, reason = hardware.tensor_gate(a, b)
    assert not ok and "different devices" in reason


# ----------------------------------------------------------------------------- capture gate
def test_capture_gate(monkeypatch):
    sig = ("shape", (2, 3), torch.float16)
    assert capture.capture_gate("kda", lambda: 1 / 0)[0]  # not capturing: nothing described
    assert capture.capture_gate("kda", lambda: (sig, True)) == (True, "")  # not capturing
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    ok, reason = capture.capture_gate("kda", lambda: (sig, False))
    assert not ok and "capture" in reason and "fwd" in reason
    capture.mark_warm("kda", sig, "fwd")
    assert capture.capture_gate("kda", lambda: (sig, False))[0]
    ok, reason = capture.capture_gate("kda", lambda: (sig, True))
    assert not ok and "bwd" in reason
    capture.mark_warm("kda", sig, "bwd")
    assert capture.capture_gate("kda", lambda: (sig, True))[0]
    # another family or signature is still cold
    assert not capture.capture_gate("cconv", lambda: (sig, False))[0]
    assert not capture.capture_gate("kda", lambda: (("other",), False))[0]


def test_warm_set_is_bounded_and_keeps_what_runs(monkeypatch):
    """A new signature a step (T or the document count changing) must not grow host memory over a
    long training run: the set holds LIMIT signatures, the least recently run dropped first."""
    monkeypatch.setattr(capture, "LIMIT", 8)
    kept = ("kept",)
    capture.mark_warm("kda", kept, "fwd")
    capture.mark_warm("kda", kept, "bwd")
    for step in range(1000):
        capture.mark_warm("kda", (step,), "fwd")
        capture.mark_warm("kda", kept, "fwd")  # the call that runs every step
        assert len(capture._warm) <= 8
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert capture.capture_gate("kda", lambda: (kept, True))[0]  # both phases, still warm
    assert capture.capture_gate("kda", lambda: ((999,), False))[0]
    assert not capture.capture_gate("kda", lambda: ((0,), False))[0]  # dropped long ago


# ----------------------------------------------------------------------------- logging
def test_report_logs_once_per_reason(caplog):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    for _ in range(3):
        report.report("kda", True, "")
        report.report("kda", False, "reason A")
        report.report("kda", False, "reason B")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs.count("kernel-fun kda: engaged") == 1
    assert msgs.count("kernel-fun kda: falling back to fla: reason A") == 1
    assert msgs.count("kernel-fun kda: falling back to fla: reason B") == 1
    assert sum(m.startswith("kernel-fun versions:") for m in msgs) == 1


def test_debug_logs_every_call(monkeypatch, caplog):
    monkeypatch.setenv("KERNEL_FUN_DEBUG", "1")
    caplog.set_level(logging.DEBUG, logger="kernel_fun")
    for _ in range(3):
        report.report("cconv", False, "reason C", detail="x[2,3]")
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 3 and "x[2,3]" in debug[0].getMessage()


def test_decide_order(monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_CCONV_DISABLE", "1")
    hit = []
    ok, reason = gate.decide("cconv", lambda: hit.append(1) or (True, ""))
    assert not ok and "KERNEL_FUN_CCONV_DISABLE" in reason and not hit
    monkeypatch.delenv("KERNEL_FUN_CCONV_DISABLE")
    ok, reason = gate.decide("cconv", lambda: (True, ""), lambda: (False, "second"), lambda: 1 / 0)
    assert (ok, reason) == (False, "second")


# ----------------------------------------------------------------------------- the module map
def test_no_import_circle_in_common():
    """Each _common module imports only modules above it: switches and hardware import no
    other gate module; compat imports switches only; gate imports compat and switches."""
    import ast
    import pathlib

    import kernel_fun._common as common

    root = pathlib.Path(common.__file__).parent
    graph = {}
    for path in root.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps |= {a.name for a in node.names}
        graph[path.stem] = deps & {p.stem for p in root.glob("*.py")}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    for mod in graph:
        assert mod not in reach(mod), f"import circle through _common.{mod}"
    assert graph["compat"] <= {"switches"}


def test_getenv_sees_changes_at_once(monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_DEBUG", "1")
    assert switches.getenv("KERNEL_FUN_DEBUG") == "1" and switches.debug()
    monkeypatch.setenv("KERNEL_FUN_DEBUG", "0")
    assert not switches.debug()
    monkeypatch.delenv("KERNEL_FUN_DEBUG")
    assert switches.getenv("KERNEL_FUN_DEBUG") is None
