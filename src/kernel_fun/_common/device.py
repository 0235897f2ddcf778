"""The launch device: our kernels run on their tensors' device, whatever device is current.

Triton launches on the *current* CUDA device and its current stream (``JITFunction.run`` asks
the driver for both), so a call whose tensors live on ``cuda:1`` while ``cuda:0`` is current
would launch on the wrong device. Every public op enters ``on_device(t.device)`` around its
launches, forward and backward: the backward too, because which thread runs it, with which
device current, is autograd's choice, not ours (eager autograd's per-device worker threads
set their device; the guard keeps us correct on any other path, e.g. compiled autograd).

Host cost matters (design: a call's Python is part of its speed). ``on_device`` returns one
shared no-op context for CPU tensors, for ``cuda`` without an index, and when the device is
already current (the common case: one process per GPU with ``torch.cuda.set_device``); only a
real switch pays for ``torch.cuda.device``. ``tools/guard_cost.py`` times it (mocked CUDA,
CPU, 2026-12-01: 0.44-0.75 us per ``with`` when the device is current, against 1.9-3.2 us for
``torch.cuda.device(t.device)`` on every call; docs/development.md "Two GPUs").

``index(dev)`` and ``key(dev)`` are the one place a device is resolved: no index means the
current device, never 0. The hardware probes cache by ``index``, the capture warm set by ``key``.
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


# ``torch.device.type`` builds a new str per access (0.35 us, CPU, torch 2.13) while ``.index``
# costs 0.06 us, so the per-call paths below branch on the index: a tensor's CUDA device always
# has one, a CPU tensor's never does.

def index(dev) -> int:
    """The index of CUDA device ``dev`` (the caller has checked it is CUDA): its own, or the
    current device's when it has none (``torch.device("cuda")``), never 0 by default."""
    i = dev.index
    return current_index() if i is None else i


def key(dev):
    """``dev`` as a key of per-device caches: a tensor's device as it is (CUDA ones carry their
    index; ``cpu`` under the interpreter), ``cuda`` without an index as the current device."""
    if dev.index is None and dev.type == "cuda":
        import torch

        return torch.device("cuda", current_index())
    return dev


def on_device(dev):
    """A context manager making CUDA device ``dev`` current for the launches inside it: the
    shared no-op context when there is nothing to switch (CPU, ``cuda`` without an index, or
    ``dev`` already current), else ``torch.cuda.device(dev.index)``, which restores the
    previous device on exit (also when the body raises)."""
    i = dev.index
    if i is None:
        return _NULL  # a CPU tensor, or "cuda": the current device, nothing to switch
    if _current is None:
        _bind()
    if i == _current():
        return _NULL
    return _switch(i)
