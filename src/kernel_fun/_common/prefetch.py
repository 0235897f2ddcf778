"""L2 prefetch of a tile a loop will load later, for the sequential scans.

Triton 3.6's pipeliner, at two stages, issues a chunk's copies at the end of the chunk before and
waits for all of them first thing (docs/gdn.md, twenty-fourth session), so in a scan whose
products run one after another their latency is on the dependent chain every chunk. Three stages
issue them a chunk earlier but need a third shared-memory buffer of every tile, which costs a scan
its second program an SM. ``l2_rows`` instead asks L2 for the rows of two tiles of a later chunk
(``cp.async.bulk.prefetch.L2.global``, sm_90 and later: one instruction a row, whatever its length;
no register held, nothing waited for), so that the copies issued for them later find them there.

A hint only: it changes no value. Inline assembly does not run under Triton's interpreter, so
there it compiles to nothing (``ASM``, False exactly there), and the CPU tests run the same code
path without it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .tuning import interpreting

ASM = tl.constexpr(not interpreting())


@triton.jit
def l2_rows(a, a_stride, A_BYTES: tl.constexpr, b, b_stride, B_BYTES: tl.constexpr, ahead, n_rows,
            ROWS: tl.constexpr):
    """Prefetch into L2 the rows ``0 <= r < min(ROWS, n_rows)`` of two tiles ``ahead`` rows on from
    ``a`` and ``b``: rows ``a_stride`` (``b_stride``) elements apart, ``A_BYTES`` (``B_BYTES``, each a
    multiple of 16, from 16-byte aligned rows) bytes each; one lane a row, ``2 * ROWS`` lanes. A row
    at or past ``n_rows`` is taken as row ``n_rows - 1`` (in a scan: the sequence's last row, before
    the tiles where they start past its end), which the caller guarantees is memory it may read;
    ``n_rows`` varies with the loop, so no address is hoisted out of it into a register held across
    it (sm_90a: each row a separate instruction costs the forward scan spill ops it has none of)."""
    if ASM:
        lane = tl.arange(0, 2 * ROWS)
        r = ahead + tl.minimum(lane % ROWS, n_rows - 1)
        in_a = lane < ROWS
        ptr = tl.where(in_a, a + r * a_stride, (b + r * b_stride).to(a.dtype))
        # the address rounded down to 16 bytes, as the instruction requires (a hint must not fault on
        # a tensor that is not aligned; the row's last bytes are then left to the copy itself)
        tl.inline_asm_elementwise(
            "{ .reg .b64 t; and.b64 t, $1, -16; cp.async.bulk.prefetch.L2.global [t], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr, tl.where(in_a, A_BYTES, B_BYTES)], dtype=tl.int32, is_pure=False, pack=1)
