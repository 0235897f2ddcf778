"""The launch device: our kernels run on their tensors' device, whatever device is current.

Triton launches on the *current* CUDA device and its current stream (``JITFunction.run`` asks
the driver for both), so a call whose tensors live on ``cuda:1`` while ``cuda:0`` is current
would launch on the wrong device. Every public op enters ``on_device(t.device)`` around its
launches, forward and backward: the backward too, because where it runs is autograd's choice
(a per-device worker thread in eager autograd, the calling thread under compiled autograd or
a reentrant ``torch.autograd.grad``), not ours.

Host cost matters (design: a call's Python is part of its speed). ``on_device`` returns one
shared no-op context for CPU tensors, for ``cuda`` without an index, and when the device is
already current (the common case: one process per GPU with ``torch.cuda.set_device``); only a
real switch pays for ``torch.cuda.device``. Cost measured in tests/common/test_devices.py's
micro-benchmark (mocked CUDA: see ``test_guard_host_cost``).

``index(dev)`` is the one place a device's index is resolved: ``None`` means the current
device, never 0. Per-device caches (hardware probes, the capture warm set) key by it.
"""
from __future__ import annotations

import contextlib

_NULL = contextlib.nullcontext()
_current = None  # torch.cuda.current_device, bound on first CUDA use (tests monkeypatch it)
_switch = None  # torch.cuda.device, bound likewise


def _bind() -> None:
    global _current, _switch
    import torch

    if _current is None:
        _current = torch.cuda.current_device
    if _switch is None:
        _switch = torch.cuda.device


def current_index() -> int:
    """The current CUDA device's index."""
    if _current is None:
        _bind()
    return _current()


def index(dev) -> int | None:
    """The CUDA index of ``dev`` (a ``torch.device``), the current device's when it has none;
    None for a non-CUDA device."""
    if dev.type != "cuda":
        return None
    i = dev.index
    return current_index() if i is None else i


def key(dev):
    """A hashable name of ``dev`` for per-device caches: the CUDA index, or the device type
    (``"cpu"`` under the interpreter)."""
    if dev.type != "cuda":
        return dev.type
    i = dev.index
    return current_index() if i is None else i


def on_device(dev):
    """A context manager making CUDA device ``dev`` current for the launches inside it: the
    shared no-op context when there is nothing to switch (CPU, ``cuda`` without an index, or
    ``dev`` already current), else ``torch.cuda.device(dev.index)``, which restores the
    previous device on exit."""
    if dev.type != "cuda":
        return _NULL
    i = dev.index
    if i is None:
        return _NULL  # "cuda" means the current device: nothing to switch
    if _current is None:
        _bind()
    if i == _current():
        return _NULL
    return _switch(i)
