"""Every op on its tensors' own device, on the CPU: the device guard's logic with a mocked CUDA
(current device, device switch), per-device probes and the capture warm set with fake devices,
and each family's forward and backward entering the guard with its tensors' device around
every launch (launch witness counted inside and outside the guard).

The real thing (tensors on cuda:1 while cuda:0 is current) is
tests/common/test_ops_multi_gpu.py, skipped without two GPUs.
"""
import contextlib
from types import SimpleNamespace

import family_modules
import pytest
import torch

from kernel_fun._common import capture, device, hardware
from kernel_fun._common.witness import launches


@pytest.fixture
def fake_cuda(monkeypatch):
    """A mocked CUDA for ``_common/device.py``: ``state.current`` is the current device, and
    every ``torch.cuda.device(i)`` the guard opens is recorded in ``state.switched``."""
    state = SimpleNamespace(current=0, switched=[], calls=0)

    def current():
        state.calls += 1
        return state.current

    @contextlib.contextmanager
    def switch(i):
        state.switched.append(i)
        prev, state.current = state.current, i
        try:
            yield
        finally:
            state.current = prev

    monkeypatch.setattr(device, "_current", current)
    monkeypatch.setattr(device, "_switch", switch)
    hardware.reset_probes()
    yield state
    hardware.reset_probes()


CUDA0, CUDA1, CUDA = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda")


# ----------------------------------------------------------------------------- the guard
def test_guard_switches_only_to_another_device(fake_cuda):
    assert device.on_device(torch.device("cpu")) is device._NULL
    assert fake_cuda.calls == 0  # a CPU tensor asks CUDA nothing
    assert device.on_device(CUDA) is device._NULL  # "cuda": the current device, nothing to do
    assert device.on_device(CUDA0) is device._NULL  # already current
    assert fake_cuda.switched == []
    with device.on_device(CUDA1):
        assert fake_cuda.current == 1
        with device.on_device(CUDA1):  # nested on the same device: no second switch
            pass
    assert fake_cuda.switched == [1] and fake_cuda.current == 0  # restored on exit
    fake_cuda.current = 1
    with device.on_device(CUDA0):
        assert fake_cuda.current == 0
    assert fake_cuda.switched == [1, 0] and fake_cuda.current == 1


def test_guard_restores_the_device_when_the_body_raises(fake_cuda):
    with pytest.raises(RuntimeError):
        with device.on_device(CUDA1):
            raise RuntimeError("launch failed")
    assert fake_cuda.current == 0


def test_index_without_an_index_is_the_current_device_not_zero(fake_cuda):
    fake_cuda.current = 3
    assert device.index(CUDA) == 3 and device.key(CUDA) == torch.device("cuda", 3)
    assert device.index(CUDA1) == 1 and device.key(CUDA1) == CUDA1
    calls = fake_cuda.calls
    assert device.key(torch.device("cpu")) == torch.device("cpu")
    assert fake_cuda.calls == calls  # a CPU key asks CUDA nothing


# ----------------------------------------------------------------------------- probes
def _on(dev):
    """A stand-in tensor for the tensor gate, which reads only ``.device``."""
    return SimpleNamespace(device=dev)


def test_two_devices_with_different_capabilities_gate_apart(fake_cuda, monkeypatch):
    caps = {0: (9, 0), 1: (8, 0)}
    reads = []
    monkeypatch.setattr(hardware, "_read_capability", lambda i: reads.append(i) or caps[i])
    assert hardware.tensor_gate(_on(CUDA0), _on(CUDA0)) == (True, "")
    ok, reason = hardware.tensor_gate(_on(CUDA1))
    assert not ok and "sm80" in reason
    # cached per device: asking again reads nothing, and device 0's verdict is not device 1's
    assert hardware.tensor_gate(_on(CUDA0))[0] and not hardware.tensor_gate(_on(CUDA1))[0]
    assert reads == [0, 1]
    # "cuda" with no index is the current device's verdict
    fake_cuda.current = 1
    assert not hardware.tensor_gate(_on(CUDA))[0]
    fake_cuda.current = 0
    assert hardware.tensor_gate(_on(CUDA))[0]
    assert not hardware.tensor_gate(_on(CUDA0), _on(CUDA1))[0]  # two devices: refused
    assert reads == [0, 1]


def test_sm_count_is_probed_per_device(fake_cuda, monkeypatch):
    props = {0: 132, 1: 78}
    reads = []

    def get_props(i):
        reads.append(i)
        return SimpleNamespace(multi_processor_count=props[i])

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_props)
    hardware.reset_probes()
    assert hardware.sm_count(CUDA0) == 132 and hardware.sm_count(CUDA1) == 78
    fake_cuda.current = 1
    assert hardware.sm_count(CUDA) == 78  # no index: the current device's
    assert hardware.sm_count(CUDA0) == 132 and reads == [0, 1]  # cached per index
    assert hardware.sm_count(torch.device("cpu")) == 4  # the interpreter's stand-in
    hardware.reset_probes()
    assert hardware.sm_count(CUDA0) == 132 and reads == [0, 1, 0]
    hardware.reset_probes()  # no fake count left behind for a later test


def test_machine_gate_asks_about_the_current_device(fake_cuda, monkeypatch):
    monkeypatch.setattr(hardware, "_read_capability", lambda i: {0: (9, 0), 1: (8, 6)}[i])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hardware.machine_gate()[0]
    fake_cuda.current = 1
    ok, reason = hardware.machine_gate()
    assert not ok and "sm86" in reason


def test_gdn_hopper_note_reads_the_tensors_device(fake_cuda, monkeypatch):
    from kernel_fun.gdn import ops

    monkeypatch.setattr(hardware, "_read_capability", lambda i: {0: (10, 0), 1: (9, 0)}[i])
    monkeypatch.setattr(hardware, "triton_version", lambda: (3, 6, 0))
    q = torch.randn(1, 4, 1, 64)
    where = [CUDA0]
    # a CPU tensor that reports a CUDA device (the note reads only .device and the probe)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: where[0]), raising=False)
    assert ops.fla_refuses_backward(q) is None  # device 0: Blackwell, fla trains
    where[0] = CUDA1
    assert "fla #640" in ops.fla_refuses_backward(q)  # device 1: Hopper, fla refuses
    where[0] = CUDA
    assert ops.fla_refuses_backward(q) is None
    fake_cuda.current = 1
    assert "fla #640" in ops.fla_refuses_backward(q)


@pytest.mark.parametrize("ver", [(3, 6, 0), (3, 8, 0)])
def test_dot_families_wait_for_triton_3_8_on_blackwell(fake_cuda, monkeypatch, clean_state, ver):
    """The ops pass their family to the tensor gate: on Blackwell below Triton 3.8 kda's and gdn's calls
    route to fla with the Triton issues in the reason (cconv's and gnorm's do not); from 3.8 they do not."""
    from kernel_fun import cconv, gdn, gnorm, kda

    monkeypatch.setattr(hardware, "_read_capability", lambda i: (10, 0))
    monkeypatch.setattr(hardware, "triton_version", lambda: ver)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: CUDA0), raising=False)
    t = family_modules.load("gdn", "chain_cases").make_inputs(B=1, T=20, H=1, HV=1, K=64, V=64, device="cpu",
                                                             dtype=torch.float16)
    x = torch.randn(1, 12, 16).to(torch.float16)
    reasons = {
        "kda": kda.is_supported(t["q"], t["k"], t["v"], t["q"], t["beta"])[1],
        "gdn": gdn.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"])[1],
        "cconv": cconv.is_supported(x, torch.randn(16, 4).to(torch.float16), activation="silu")[1],
        "gnorm": gnorm.is_supported(x, x, torch.ones(16).to(torch.float16), None)[1],
    }
    for fam, reason in reasons.items():
        held = fam in hardware.DOT_FAMILIES and ver < (3, 8, 0)
        assert ("tl.dot recurrences race" in reason) is held, (fam, reason)


# ----------------------------------------------------------------------------- capture warm set
def test_capture_warm_set_is_per_device(fake_cuda, monkeypatch):
    capture.reset_warm()
    sig = (("shape", 2), torch.float16)
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    capture.mark_warm("kda", sig, "fwd", CUDA0)
    capture.mark_warm("kda", sig, "bwd", CUDA0)
    assert capture.capture_gate("kda", lambda: (sig, True), CUDA0) == (True, "")
    ok, reason = capture.capture_gate("kda", lambda: (sig, True), CUDA1)
    assert not ok and "cuda:1" in reason and "bwd/fwd cold" in reason
    fake_cuda.current = 1  # "cuda" under capture on device 1 is device 1's set
    assert not capture.capture_gate("kda", lambda: (sig, False), CUDA)[0]
    capture.mark_warm("kda", sig, "fwd", CUDA1)
    assert capture.capture_gate("kda", lambda: (sig, False), CUDA)[0]
    assert not capture.capture_gate("kda", lambda: (sig, True), CUDA1)[0]  # bwd still cold there
    capture.reset_warm()


# ----------------------------------------------------------------------------- every family's op
class GuardRecorder:
    """Stands in for ``device.on_device``: records the device of every guard the ops open and
    counts our launches made inside a guard, so a launch outside one is visible."""

    def __init__(self):
        self.devices, self.inside, self.depth = [], 0, 0

    def __call__(self, dev):
        rec = self

        @contextlib.contextmanager
        def guard():
            rec.devices.append(dev)
            rec.depth += 1
            start = launches()
            try:
                yield
            finally:
                rec.depth -= 1
                if rec.depth == 0:
                    rec.inside += launches() - start
        return guard()

    def reset(self):
        self.devices, self.inside = [], 0


def _cconv():
    from kernel_fun import cconv

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 12, 16, generator=g).requires_grad_()
    w = torch.randn(16, 4, generator=g).requires_grad_()
    b = torch.randn(16, generator=g).requires_grad_()
    return lambda: cconv.causal_conv1d(x, w, b, activation="silu")[0], x


def _gnorm():
    from kernel_fun import gnorm

    g = torch.Generator().manual_seed(0)
    x, gate = (torch.randn(6, 32, generator=g).requires_grad_() for _ in range(2))
    w = torch.ones(32).requires_grad_()
    return lambda: gnorm.rms_norm_gated(x, gate, w, None), x


def _delta(family, monkeypatch):
    family_modules.load(family, "fla_standins").install(monkeypatch)
    cases = family_modules.load(family, "chain_cases")
    t = cases.make_inputs(B=1, T=20, H=1, HV=1, K=64, V=64, device="cpu", dtype=torch.float16)
    if family == "kda":
        from kernel_fun import kda

        def call():
            return kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], A_log=t["A_log"],
                                 dt_bias=t["dt_bias"], use_gate_in_kernel=True,
                                 use_qk_l2norm_in_kernel=True)[0]
    else:
        from kernel_fun import gdn

        def call():
            return gdn.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], A_log=t["A_log"],
                                              dt_bias=t["dt_bias"], use_gate_in_kernel=True,
                                              use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)[0]
    return call, t["q"]


@pytest.mark.parametrize("family", ["cconv", "gnorm", "kda", "gdn"])
def test_each_family_launches_under_its_tensors_device(family, monkeypatch, clean_state):
    if torch.cuda.is_available():
        pytest.skip("CPU tier; on GPUs tests/common/test_ops_multi_gpu.py runs on cuda:1")
    call, x = {"cconv": _cconv, "gnorm": _gnorm}.get(family, lambda: _delta(family, monkeypatch))()
    rec = GuardRecorder()
    monkeypatch.setattr(device, "on_device", rec)
    marks = []
    real_mark = capture.mark_warm
    monkeypatch.setattr(capture, "mark_warm", lambda *a, **k: marks.append(a) or real_mark(*a, **k))
    if family == "cconv":  # cconv's autograd imported mark_warm by name
        from kernel_fun.cconv import autograd as cconv_autograd

        monkeypatch.setattr(cconv_autograd, "mark_warm", lambda *a, **k: marks.append(a) or real_mark(*a, **k))

    before = launches()
    y = call()
    fwd = launches() - before
    assert fwd > 0, "our forward did not launch (routed to fla?)"
    assert rec.devices and all(d == x.device for d in rec.devices), rec.devices
    assert rec.inside == fwd, f"{fwd - rec.inside} forward launches outside the device guard"
    assert [m[2:] for m in marks] == [("fwd", x.device)]

    rec.reset()
    before = launches()
    y.float().square().sum().backward()
    bwd = launches() - before
    assert bwd > 0
    assert rec.devices and all(d == x.device for d in rec.devices), rec.devices
    assert rec.inside == bwd, f"{bwd - rec.inside} backward launches outside the device guard"
    assert [m[2:] for m in marks] == [("fwd", x.device), ("bwd", x.device)]
