#!/usr/bin/env python
"""Where a kernel's loads cost more than their bytes, read off the sm_90a compile without a GPU
(the lessons of docs/development.md, session 23). For each lowering spec (``kernel_fun.bench.lowering``):

    sync   loads left synchronous inside a loop: a ``tt.load`` in an ``scf.for`` body of the TTGIR (the
           pipeliner copies the others a stage ahead with ``async_copy_global_to_local``), named by
           the source variable Triton gave the value (``b_gl`` from ``%b_gl_214``); a load whose value
           the loop yields is the next iteration's, prefetched into registers, and listed apart
    smem   register tiles written to shared memory inside a loop (``ttg.local_alloc %x``): a product's
           operand made in registers. Where the value is a loaded tile under a ``where`` (a mask), the
           pipelined copy was read back, masked and written again: store the zeros instead
    b16    2-byte global loads in the PTX (``ld.global.b16``/``.u16``): a mask or address that varies
           along a tile's contiguous dimension splits the load into single elements (a strided [BT]
           vector of 16-bit values is one element a thread anyway)

    python tools/load_audit.py state_scan_bwd gdn_wy_dqk      # some specs (all by default)
    python tools/load_audit.py --full --only gdn              # every config, labels containing 'gdn'

A count is a lead, not a verdict: read the TTGIR of what it flags (``lowering.build(...).asm``).
Run with TRITON_INTERPRET unset and kernel-fun importable (``PYTHONPATH=src``).
"""
from __future__ import annotations

import argparse
import re
import sys

from kernel_fun.bench import lowering


def loop_lines(ttgir: str):
    """The TTGIR lines inside an ``scf.for`` body (any depth)."""
    depth, loops = 0, []
    for line in ttgir.splitlines():
        if loops:
            yield line
        opens, closes = line.count("{"), line.count("}")
        if "scf.for" in line and line.rstrip().endswith("{"):
            loops.append(depth)
        depth += opens - closes
        while loops and depth <= loops[-1]:
            loops.pop()


def audit(k) -> dict:
    inner = list(loop_lines(k.asm["ttgir"]))
    # a load whose value the loop yields is the next iteration's, prefetched into registers (the
    # pipeliner's form for a tile a product does not read from shared memory): not on the chain
    yielded = {v for ln in inner if "scf.yield" in ln for v in re.findall(r"%[\w#]+", ln.split(":")[0])}
    loads = [(m.group(1), m.group(2)) for ln in inner
             for m in [re.search(r"(%([A-Za-z_]\w*?)(?:_\d+)?) = tt\.load ", ln)] if m]
    sync = [name for value, name in loads if value not in yielded]
    ahead = [name for value, name in loads if value in yielded]
    smem = [m.group(1) for ln in inner for m in [re.search(r"ttg\.local_alloc %([A-Za-z_]\w*?)(?:_\d+)? ", ln)] if m]
    b16 = len(re.findall(r"\bld\.global(?:\.[a-z0-9:]+)*\.(?:b16|u16|s16|f16)\b", k.asm["ptx"]))
    return dict(sync=sync, ahead=ahead, smem=smem, b16=b16)


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"some of: {', '.join(lowering.SPECS)} (default: all)")
    p.add_argument("--full", action="store_true", help="every config a bench may force, at every flag combination")
    p.add_argument("--only", default="", help="only the labels containing this text")
    p.add_argument("--target", default="sm_90a", choices=list(lowering.TARGETS))
    a = p.parse_args(argv)
    names = a.names or list(lowering.SPECS)
    bad = [n for n in names if n not in lowering.SPECS]
    if bad:
        p.error(f"unknown {', '.join(bad)}")
    for name in names:
        for label, fn, ptr, const, cfg in lowering.SPECS[name](full=a.full):
            if a.only not in label:
                continue
            k = lowering.build(fn, ptr, const, cfg.num_warps, cfg.num_stages, getattr(cfg, "maxnreg", None),
                               lowering.TARGETS[a.target])
            r = audit(k)
            print(f"{label}\n    sync in loop: {', '.join(r['sync']) or '-'}"
                  f" (prefetched in registers: {', '.join(r['ahead']) or '-'})\n"
                  f"    smem stores in loop: {', '.join(r['smem']) or '-'}\n    2-byte loads: {r['b16']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
