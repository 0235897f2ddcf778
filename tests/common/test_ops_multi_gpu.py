"""Two GPUs: every family's op with all its tensors on cuda:1 while cuda:0 is current, forward
and backward, against the same call on cuda:0 (bitwise: same GPU model, deterministic
kernels); every kernel of the step on device 1 (the profiler's device index); the current
device left as it was; under CUDA graph capture on cuda:1; the capture warm set per device.

Needs two CUDA devices of one kind (skipped otherwise). The CPU half of this is
tests/common/test_devices.py.
"""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kernel_fun._common import capture
from kernel_fun._common.witness import launches

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]
TESTS = Path(__file__).parents[1]
FAMILIES = ["cconv", "gnorm", "kda", "gdn"]


def _cases(family):
    name = f"{family}_cases_multi_gpu"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS / family / "chain_cases.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _inputs(family):
    """Leaf inputs on cuda:0, seeded (``_on`` copies them to another device)."""
    gen = torch.Generator(device="cuda:0").manual_seed(0)

    def r(*s, dt=torch.bfloat16):
        return torch.randn(*s, device="cuda:0", generator=gen).to(dt)

    if family == "cconv":
        return dict(x=r(2, 512, 256), w=r(256, 4, dt=torch.float32), b=r(256, dt=torch.float32))
    if family == "gnorm":
        return dict(x=r(2, 256, 512), g=r(2, 256, 512), w=r(512, dt=torch.float32))
    with torch.cuda.device(0):
        return _cases(family).make_inputs(B=1, T=256, H=2, HV=4, K=128, V=128, device="cuda:0",
                                          dtype=torch.bfloat16)


def _on(t: dict, dev) -> dict:
    return {k: v.detach().to(dev).requires_grad_(True) for k, v in t.items()}


def _call(family, t):
    """The family's public op on ``t``: its first output."""
    if family == "cconv":
        from kernel_fun import cconv

        return cconv.causal_conv1d(t["x"], t["w"], t["b"], activation="silu")[0]
    if family == "gnorm":
        from kernel_fun import gnorm

        return gnorm.rms_norm_gated(t["x"], t["g"], t["w"], None)
    kw = dict(A_log=t["A_log"], dt_bias=t["dt_bias"], use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)
    if family == "kda":
        from kernel_fun import kda

        return kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)[0]
    from kernel_fun import gdn

    return gdn.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], use_beta_sigmoid_in_kernel=True, **kw)[0]


def _supported(family, t):
    """The family's ``is_supported`` for ``_call``'s arguments."""
    from kernel_fun import cconv, gdn, gnorm, kda

    if family == "cconv":
        return cconv.is_supported(t["x"], t["w"], t["b"], activation="silu")
    if family == "gnorm":
        return gnorm.is_supported(t["x"], t["g"], t["w"], None)
    kw = dict(A_log=t["A_log"], dt_bias=t["dt_bias"], use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)
    if family == "kda":
        return kda.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)
    return gdn.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"], use_beta_sigmoid_in_kernel=True, **kw)


def _cotangent(y):
    gen = torch.Generator(device=y.device).manual_seed(1)
    return torch.randn(y.shape, device=y.device, generator=gen).to(y.dtype)


def _step(family, t, dy=None):
    """Forward and backward (a seeded cotangent unless ``dy``): {"out", "d<name>", ...}."""
    y = _call(family, t)
    dy = _cotangent(y) if dy is None else dy
    names = list(t)
    grads = torch.autograd.grad(y, [t[n] for n in names], dy, allow_unused=True)
    return {"out": y, **{"d" + n: g for n, g in zip(names, grads) if g is not None}}


@pytest.fixture(autouse=True)
def _current_is_cuda0(clean_state):
    torch.cuda.set_device(0)
    yield
    torch.cuda.set_device(0)


@pytest.mark.parametrize("family", FAMILIES)
def test_op_on_cuda1_while_cuda0_is_current(family):
    base = _inputs(family)
    ref = {k: v.detach().clone() for k, v in _step(family, _on(base, "cuda:0")).items()}
    t1 = _on(base, "cuda:1")
    _step(family, t1)  # compile and load on device 1 before profiling
    torch.cuda.synchronize(1)
    before = launches()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = _step(family, t1)
        torch.cuda.synchronize(1)
    assert launches() > before, "our kernels did not run (routed to fla?)"
    assert torch.cuda.current_device() == 0, "the op left another device current"
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels and all(e.device_index == 1 for e in kernels), \
        sorted({(e.name[:60], e.device_index) for e in kernels if e.device_index != 1})
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].device == torch.device("cuda", 1), k
        assert torch.equal(got[k].cpu(), v.cpu()), k


@pytest.mark.parametrize("family", FAMILIES)
def test_backward_on_cuda1_with_cuda0_current_in_the_calling_thread(family):
    """torch.autograd.grad from a thread whose current device is 0; the graph's tensors are on 1."""
    import threading

    base = _inputs(family)
    ref = {k: v.detach().cpu() for k, v in _step(family, _on(base, "cuda:1")).items()}
    out, errors = {}, []

    def run():
        try:
            torch.cuda.set_device(0)
            out.update({k: v.detach().cpu() for k, v in _step(family, _on(base, "cuda:1")).items()})
            assert torch.cuda.current_device() == 0
        except Exception as e:  # re-raised in the test's thread
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join(timeout=300)
    assert not th.is_alive() and not errors, errors
    for k, v in ref.items():
        assert torch.equal(out[k], v), k


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_on_cuda1_and_the_warm_set_per_device(family):
    base = _inputs(family)
    t0, t1 = _on(base, "cuda:0"), _on(base, "cuda:1")
    capture.reset_warm()
    _step(family, t0)  # warm on device 0 only
    torch.cuda.synchronize(0)
    with torch.cuda.device(1):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                ok, reason = _supported(family, t1)  # asks, launches nothing
        finally:
            del graph
    assert not ok and "cuda:1" in reason and "capture" in reason, reason
    with torch.cuda.device(1):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                eager = {k: v.detach().clone() for k, v in _step(family, t1).items()}
            dy = _cotangent(eager["out"])  # made outside the capture (a seeded generator)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        before = launches()
        with torch.cuda.graph(graph):
            static = _step(family, t1, dy)
        assert launches() > before, "the warm signature on cuda:1 did not run ours under capture"
        graph.replay()
        torch.cuda.synchronize()
    for k, v in eager.items():
        assert static[k].device == torch.device("cuda", 1) and torch.equal(static[k], v), k
    assert torch.cuda.current_device() == 0
