"""The capture gate: under CUDA graph capture our kernels run only for a call signature that
already ran eagerly (compile and autotune cannot be captured); a cold one routes to fla.

A signature is warm for the forward, and for the backward when gradients are needed. The
stream is not part of the signature.
"""
from __future__ import annotations

_warm: dict = {}
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


def mark_warm(family: str, signature, phase: str) -> None:
    """Record that ``signature`` ran ``phase`` ("fwd" or "bwd") eagerly."""
    seen = _warm.get((family, signature))
    if seen is None:
        _warm[(family, signature)] = {phase}
    elif phase not in seen:
        seen.add(phase)


def capture_gate(family: str, describe) -> tuple[bool, str]:
    """``describe()`` -> (signature, needs_grad); called only under capture, so an eager
    call pays for nothing but the capture query."""
    if not is_capturing():
        return True, ""
    signature, needs_grad = describe()
    seen = _warm.get((family, signature), set())
    need = {"fwd", "bwd"} if needs_grad else {"fwd"}
    if need <= seen:
        return True, ""
    missing = "/".join(sorted(need - seen))
    return False, (
        f"CUDA graph capture of a call that has not run eagerly ({missing} cold): "
        f"compile and autotune cannot be captured; run it once eagerly or call warmup()"
    )


def reset_warm() -> None:
    _warm.clear()
