"""Packed documents (``cu_seqlens``): validation shared by every family."""
from __future__ import annotations

import torch

from . import switches


def check_cu_seqlens(family: str, cu_seqlens: torch.Tensor, cu_seqlens_cpu, T: int) -> None:
    """Raise a clear ValueError for malformed offsets: not 1-D int, not starting at 0,
    decreasing, or not ending at T. Values are checked only where that costs no device sync:
    a CPU tensor, ``cu_seqlens_cpu``, or under ``KERNEL_FUN_DEBUG=1``."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{family}: cu_seqlens must be 1-D [N+1] with N >= 1, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{family}: cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    host = cu_seqlens_cpu
    if host is None and cu_seqlens.device.type == "cpu":
        host = cu_seqlens
    if host is None and switches.debug():
        host = cu_seqlens.cpu()
    if host is None:
        return
    h = host.tolist()
    if h[0] != 0:
        raise ValueError(f"{family}: cu_seqlens must start at 0, got {h[0]}")
    if any(b < a for a, b in zip(h, h[1:])):
        raise ValueError(f"{family}: cu_seqlens must be non-decreasing")
    if h[-1] != T:
        raise ValueError(f"{family}: cu_seqlens must end at T={T}, got {h[-1]}")


def packed_gate(family: str, B: int, T: int, cu_seqlens, cu_seqlens_cpu) -> tuple[str | None, int]:
    """The front-ends' question about packed documents: ``(reason to route to fla or None,
    number of sequences N)``. Malformed offsets raise (``check_cu_seqlens``)."""
    if cu_seqlens is None:
        return None, B
    if B != 1:
        return f"cu_seqlens with batch size {B} (packed documents need B == 1; fla raises)", B
    check_cu_seqlens(family, cu_seqlens, cu_seqlens_cpu, T)
    return None, cu_seqlens.numel() - 1
