"""The [T, BT] chunk-local layout of the delta rule's score matrices (A, Aqk: row t holds token t's
row of its chunk's [BT, BT] matrix): which entries lie above the diagonal, the part fla leaves
unwritten and gdn's gated scores store as zeros."""
from __future__ import annotations

import torch


def above_diagonal(bounds, BT: int) -> torch.Tensor:
    """``[bounds[-1], BT]`` bool, True where column j lies above the diagonal of token t's chunk (j
    greater than t's row in its chunk); chunks restart at each document start ``bounds[i]``."""
    row = torch.cat([torch.arange(e - s) % BT for s, e in zip(bounds[:-1], bounds[1:])])
    return torch.arange(BT)[None, :] > row[:, None]
