"""Hardware probes and the tensor gate: which devices our kernels are built and tested for.

Triton families are built and tested for Hopper (sm90) and datacenter Blackwell (sm100,
sm103); anything else routes to fla with its capability in the reason. Probes run once per
device and are cached by the device's index (two GPUs of different kinds in one host gate
apart; tests monkeypatch ``_read_capability`` and call ``reset_probes``). A device ``cuda``
without an index is the current device's (``device.index``), never device 0's.
"""
from __future__ import annotations

from . import device as _device
from .tuning import interpreting

ADMITTED_CAPABILITIES = ((9, 0), (10, 0), (10, 3))
_capability_cache: dict = {}
_gate_cache: dict = {}


def _read_capability(index: int) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(index))


def device_capability(index: int) -> tuple[int, int]:
    """The compute capability of CUDA device ``index``, probed once and cached."""
    if index not in _capability_cache:
        _capability_cache[index] = _read_capability(index)
    return _capability_cache[index]


_sm_cache: dict = {}


def sm_count(device) -> int:
    """Streaming multiprocessors of the ``torch.device`` ``device``, probed once per index (4 for
    CPU tensors under the interpreter: the persistent and grid-sizing launchers' stand-in)."""
    if device.type != "cuda":
        return 4
    index = _device.index(device)
    n = _sm_cache.get(index)
    if n is None:
        import torch

        n = _sm_cache[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def reset_probes() -> None:
    """Forget the cached probes."""
    _capability_cache.clear()
    _gate_cache.clear()
    _sm_cache.clear()


def device_gate(index: int) -> tuple[bool, str]:
    """(ok, reason) for CUDA device ``index`` (cached with the probe)."""
    verdict = _gate_cache.get(index)
    if verdict is None:
        cap = device_capability(index)
        if tuple(cap) in ADMITTED_CAPABILITIES:
            verdict = (True, "")
        else:
            verdict = (False, f"compute capability sm{cap[0]}{cap[1]} is not Hopper (sm90) or "
                              f"datacenter Blackwell (sm100/sm103)")
        _gate_cache[index] = verdict
    return verdict


def tensor_gate(*tensors) -> tuple[bool, str]:
    """Where the tensors live: one admitted CUDA device, or CPU under the interpreter."""
    dev = None
    for t in tensors:
        if t is None:
            continue
        d = t.device
        if dev is None:
            dev = d
        elif d != dev:
            devices = {t.device for t in tensors if t is not None}
            return False, "tensors on different devices: " + ", ".join(sorted(map(str, devices)))
    if dev.type == "cuda":
        return device_gate(_device.index(dev))
    if dev.type == "cpu" and interpreting():
        return True, ""
    return False, "not a CUDA tensor"


def machine_gate() -> tuple[bool, str]:
    """Would a call on this machine's default device be admitted (doctor's question)?"""
    import torch

    if torch.cuda.is_available():
        return device_gate(_device.current_index())
    if interpreting():
        return True, "TRITON_INTERPRET=1: CPU tensors run through Triton's interpreter"
    return False, "no CUDA device"
