"""Hardware probes and the tensor gate: which devices our kernels are built and tested for.

Triton families are built for Hopper (sm90) and datacenter Blackwell (sm100, sm103); anything
else routes to fla with its capability in the reason. On Blackwell the families whose kernels
are ``tl.dot`` recurrences (``DOT_FAMILIES``) also need Triton 3.8 (``dot_gate``). Probes run once
per device and are cached by the device's index (two GPUs of different kinds in one host gate
apart; tests monkeypatch ``_read_capability`` and call ``reset_probes``). A device ``cuda``
without an index is the current device's (``device.index``), never device 0's.
"""
from __future__ import annotations

import functools
import re

from . import device as _device
from .tuning import interpreting

ADMITTED_CAPABILITIES = ((9, 0), (10, 0), (10, 3))
# The families whose kernels are tl.dot recurrences along the chunks (the state scans and the stages
# beside them). Triton before 3.8 races in such kernels on Blackwell: bitwise-different outputs for
# identical inputs at 8 warps (triton-lang/triton #10590; fla 0.6.0 keeps its fwd_h on 2 warps and
# drops 8-warp configs of its chunk_o kernels there, fla #953, #1229, "until Triton 3.8"), and at 4
# warps with a 32-wide value block in a varlen loop, garbage on 3.6.0 (#9871, fixed by #9615). kda's
# and gdn's kernels run 4, 8 and 16 warps and have not run on a Blackwell GPU: there they engage from
# Triton 3.8, and below it route to fla (which gates its own configs). cconv and gnorm have no tl.dot.
DOT_FAMILIES = ("kda", "gdn")
BLACKWELL_DOT_TRITON = (3, 8, 0)
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


@functools.lru_cache(maxsize=None)
def triton_version() -> tuple:
    """The installed Triton's (major, minor, patch), local and pre-release tags dropped."""
    import triton

    parts = [re.match(r"\d*", p).group() for p in triton.__version__.split("+")[0].split(".")[:3]]
    return tuple(int(p or 0) for p in parts + ["0"] * (3 - len(parts)))


def dot_reason(capability: tuple, version: tuple | None = None) -> str:
    """Why a ``DOT_FAMILIES`` family does not run on a GPU of ``capability`` under Triton ``version``
    (default: the installed one); "" where it does. Also what ``kernel-fun check --lower`` leaves out
    of a target's compile (a kernel no call launches there)."""
    ver = triton_version() if version is None else tuple(version)
    if capability[0] == 10 and ver < BLACKWELL_DOT_TRITON:
        return (f"Triton {'.'.join(map(str, ver))} on Blackwell (sm{capability[0]}{capability[1]}): tl.dot recurrences "
                f"race there before Triton 3.8 (triton-lang/triton #10590, #9871); this family engages on "
                f"Blackwell from Triton 3.8")
    return ""


def dot_gate(index: int) -> tuple[bool, str]:
    """(ok, reason) for a ``DOT_FAMILIES`` family on CUDA device ``index``: on Blackwell, Triton 3.8."""
    reason = dot_reason(tuple(device_capability(index)))
    return not reason, reason


def tensor_gate(*tensors, family: str | None = None) -> tuple[bool, str]:
    """Where the tensors live: one admitted CUDA device (and for ``family`` in ``DOT_FAMILIES``, a
    Triton that ``dot_gate`` admits there), or CPU under the interpreter."""
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
        return _cuda_gate(_device.index(dev), family)
    if dev.type == "cpu" and interpreting():
        return True, ""
    return False, "not a CUDA tensor"


def _cuda_gate(index: int, family: str | None) -> tuple[bool, str]:
    ok, reason = device_gate(index)
    if ok and family in DOT_FAMILIES:
        return dot_gate(index)
    return ok, reason


def machine_gate(family: str | None = None) -> tuple[bool, str]:
    """Would ``family``'s call on this machine's default device be admitted (doctor's question)?"""
    import torch

    if torch.cuda.is_available():
        return _cuda_gate(_device.current_index(), family)
    if interpreting():
        return True, "TRITON_INTERPRET=1: CPU tensors run through Triton's interpreter"
    return False, "no CUDA device"
