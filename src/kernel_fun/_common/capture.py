"""The capture gate: under CUDA graph capture our kernels run only for a call signature that
already ran eagerly (compile and autotune cannot be captured); a cold one routes to fla.

A signature is warm for the forward, and for the backward when gradients are needed. The
stream is not part of the signature; the device is: Triton compiles, loads and (re)times per
device (``JITFunction`` keeps a kernel cache per device), so a call warm on ``cuda:0`` is cold
on ``cuda:1``. Callers pass the ``torch.device`` their launches run on.

The set is bounded (``LIMIT`` signatures, the least recently run dropped first): training whose T
or document count changes every step makes a new signature a step, which must not grow the host's
memory over tens of thousands of steps; a signature that keeps running stays warm.
"""
from __future__ import annotations

from collections import OrderedDict

from . import device as _device

LIMIT = 4096
_warm: OrderedDict = OrderedDict()
_query = None  # torch.cuda.is_current_stream_capturing once CUDA is known present, else False


def _capturing() -> bool:
    # torch.cuda.is_available() costs a driver query per call: asked once per process (a
    # machine does not gain a GPU mid-run), then only the capture query itself.
    global _query
    if _query is None:
        import torch

        _query = torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else False
    return bool(_query and _query())


def is_capturing() -> bool:
    return _capturing()


def _key(family: str, signature, dev):
    return family, None if dev is None else _device.key(dev), signature


def mark_warm(family: str, signature, phase: str, device=None) -> None:
    """Record that ``signature`` ran ``phase`` ("fwd" or "bwd") eagerly on ``device`` (a
    ``torch.device``; every family passes its launches' device)."""
    k = _key(family, signature, device)
    seen = _warm.get(k)
    if seen is None:
        if len(_warm) >= LIMIT:
            _warm.popitem(last=False)
        _warm[k] = {phase}
        return
    _warm.move_to_end(k)
    seen.add(phase)


def capture_gate(family: str, describe, device=None) -> tuple[bool, str]:
    """``describe()`` -> (signature, needs_grad); called only under capture, so an eager
    call pays for nothing but the capture query. ``device``: where the call would launch."""
    if not is_capturing():
        return True, ""
    signature, needs_grad = describe()
    seen = _warm.get(_key(family, signature, device), set())
    need = {"fwd", "bwd"} if needs_grad else {"fwd"}
    if need <= seen:
        return True, ""
    missing = "/".join(sorted(need - seen))
    where = "" if device is None else f" on {device}"
    return False, (
        f"CUDA graph capture of a call that has not run eagerly{where} ({missing} cold): "
        f"compile and autotune cannot be captured; run it once eagerly or call warmup()"
    )


def reset_warm() -> None:
    _warm.clear()
