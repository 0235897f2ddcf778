#!/usr/bin/env python
"""Which backward stage sets the error of kda's dA_log / ddt_bias (the per-head sums of the gate's
gradient) on a call: our chain, fla's own op, and our chain with one stage at a time replaced by fla's
(or run in another numerical mode), each against the fp64 recurrence. A diagnostic, not a test.

    PYTHONPATH=/tmp/site:src python tools/kda_dalog_attrib.py --device cuda 16 26 22 9
    PYTHONPATH=/tmp/site:src python tools/kda_dalog_attrib.py --device cuda --time   # intra_bwd in each dot precision

The calls are `tools/chain_fuzz.py --layer`'s GPU draws for the given seeds (the layer's flags, bf16).
On 2026-12-06 that fuzz (H100) had four of twenty such calls with our dA_log at 2.1e-2 to 9.2e-2 from
fp64 where fla's own op had 3.4e-3 to 1.4e-2. On the CPU (fp16, interpreted) the variants that need fla's
backward stages are skipped (fla's kernels do not run there).
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))


def _variants():
    """name -> {chain attribute: replacement} (None: fla's own op)."""
    import importlib

    from kernel_fun._delta.inputs import l2norm_bwd
    from kernel_fun.kda import chain

    stash = {}

    def fla_symbol(module, name):  # fla's stage functions (not all are in compat.FLA_CALLS)
        return getattr(importlib.import_module(module), name)

    def fla_dAv(v_new, do, scale, cu_seqlens=None, chunk_size=64, chunk_indices=None):
        dAqk, dv = fla_symbol("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_dAv")(
            q=stash["q"], k=stash["k"], v=v_new, do=do, A=stash["Aqk"], scale=scale, cu_seqlens=cu_seqlens,
            chunk_size=chunk_size, chunk_indices=chunk_indices)
        stash["dv"] = dv
        return dAqk

    def fla_dhu(q, k, w, gk, h0, dht, do, dv, A, scale, cu_seqlens, chunk_size, chunk_indices, chunk_offsets):
        return fla_symbol("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_bwd_dhu")(
            q=q, k=k, w=w, gk=gk, h0=h0, dht=dht, do=do, dv=stash["dv"], scale=scale, cu_seqlens=cu_seqlens,
            chunk_size=chunk_size, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)

    def fla_wy(**kw):
        return fla_symbol("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_wy_dqkg_fused")(**kw)

    def fla_intra(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, cu_seqlens, chunk_indices, chunk_size,
                  fast_range=None, gate_monotone=False, l2norm_rstd=None, out_dtype=None):
        dq, dk, db, dg = fla_symbol("fla.ops.kda.chunk_intra", "chunk_kda_bwd_intra")(
            q=q, k=k, g=g, beta=beta, dAqk=dAqk, dAkk=dAkk, dq=dq, dk=dk, db=db, dg=dg, cu_seqlens=cu_seqlens,
            chunk_indices=chunk_indices, chunk_size=chunk_size)
        if l2norm_rstd is not None:
            dq = l2norm_bwd(q, l2norm_rstd[0], dq).to(out_dtype)
            dk = l2norm_bwd(k, l2norm_rstd[1], dk).to(out_dtype)
        return dq, dk, db, dg

    def fla_gate(dg, g, A_log, dt_bias, cu_seqlens=None, chunk_size=64, chunk_indices=None):
        dg = fla_symbol("fla.ops.utils.cumsum", "chunk_local_cumsum")(
            dg, chunk_size=chunk_size, reverse=True, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
        if g is None:
            return dg, None, None
        return fla_symbol("fla.ops.kda.gate", "kda_gate_bwd")(g=g, A_log=A_log, dt_bias=dt_bias, dyg=dg)

    ours_intra = chain.intra_bwd

    def intra_ieee(*a, **kw):
        return ours_intra(*a, **dict(kw, dot_precision="ieee"))

    def intra_tf32x3(*a, **kw):  # three tf32 products a dot (Triton's split): about fp32's precision
        return ours_intra(*a, **dict(kw, dot_precision="tf32x3"))

    def intra_plain_tf32(*a, **kw):  # the chain's dots before 2026-12-06 (the tensor cores truncate the operands)
        return ours_intra(*a, **dict(kw, dot_precision="tf32"))

    def intra_bit_levels(*a, **kw):
        return ours_intra(*a, **dict(kw, fast_range=None, gate_monotone=False))

    def stash_forward_inputs():  # q, k and Aqk for fla's dAv, which takes them (the chain's call does not)
        ours_backward = chain.backward

        def backward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, Aqk, *a, **kw):
            stash.update(q=q, k=k, Aqk=Aqk)
            return ours_backward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, Aqk, *a, **kw)
        return backward

    return {
        "ours": {},
        "fla op": None,
        "ours, fla dAv+dhu": {"backward": stash_forward_inputs(), "score_grad_bwd": fla_dAv, "state_scan_bwd": fla_dhu},
        "ours, fla wy": {"wy_dqkg_bwd": fla_wy},
        "ours, fla intra": {"intra_bwd": fla_intra},
        "ours, fla cumsum+gate": {"dg_cumsum_gate_bwd": fla_gate},
        "ours, intra ieee dots": {"intra_bwd": intra_ieee},
        "ours, intra bit levels": {"intra_bwd": intra_bit_levels},
        "ours, intra plain tf32": {"intra_bwd": intra_plain_tf32},
        "ours, intra tf32x3": {"intra_bwd": intra_tf32x3},
    }


def time_intra(device: str) -> None:
    """The shipped intra_bwd call (l2norm fused, one anchor) at the stage bench's shape in each dot
    precision, alternated twice (ms, do_bench medians)."""
    from kernel_fun.bench.harness import median_ms
    from kernel_fun.bench.kda import STAGE_SHAPES, _check_inputs
    from kernel_fun.kda import chain

    shape = STAGE_SHAPES["cuda" if device == "cuda" else "cpu"]
    t = _check_inputs(device, **shape)
    B, T, H = t["q"].shape[:3]
    rstd = torch.rand(B * T * H, device=device) + 0.5
    intra = dict(q=t["q"], k=t["k"], g=t["g"], beta=t["beta"], dAqk=t["A"], dAkk=t["Aqk"], dq=t["dq"], dk=t["dk"],
                 db=t["db"], dg=t["dg"], chunk_size=64, fast_range=chain.INTRA_BWD_FAST_RANGE)
    if H == t["g"].shape[2]:  # the layer's call fuses the l2norm backward (HV == H)
        intra.update(l2norm_rstd=(rstd, rstd), out_dtype=t["q"].dtype)
    for dp in ("tf32", "tf32x3", "ieee") * 2:
        print(f"intra_bwd {shape} dot_precision={dp}: {median_ms(lambda: chain.intra_bwd(**intra, dot_precision=dp)):.4f} ms",
              flush=True)


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("seeds", type=int, nargs="*")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--time", action="store_true", help="time intra_bwd's two modes (time_intra)")
    p.add_argument("--variants", default="", help="';'-separated names (as printed) to run; default all")
    a = p.parse_args(argv)
    if a.time:
        time_intra(a.device)
    gpu = a.device == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float16
    import chain_fuzz
    import family_modules
    import pytest

    from kernel_fun._common import compat
    from kernel_fun.kda import chain, chunk_kda
    from kernel_fun.kda.reference import chunk_kda_ref

    mp = pytest.MonkeyPatch()
    if not gpu:
        family_modules.load("kda", "fla_standins").install(mp)
    cases = family_modules.load("kda", "chain_cases")
    variants = _variants()
    if a.variants:
        keep = [v.strip() for v in a.variants.split(";")]
        variants = {n: v for n, v in variants.items() if n in keep}
    for seed in a.seeds:
        c = chain_fuzz._call(random.Random(seed), "kda", True, 128, True)  # the GPU draw, as the fuzz's
        t, do, dht, flags = chain_fuzz.build_call("kda", c, seed, cases, a.device, dtype)
        ref = chain_fuzz.reference_of("kda", c, cases, chunk_kda_ref, do, dht, flags)(t)
        g = ref["dA_log"].detach()
        print(f"seed={seed} " + " ".join(f"{k}={v}" for k, v in c.items()), f"ref dA_log {g.tolist()}", flush=True)
        for name, patch in variants.items():
            try:
                with pytest.MonkeyPatch.context() as m:
                    for attr, fn in (patch or {}).items():
                        m.setattr(chain, attr, fn)
                    fn = compat.fla_symbol("fla.ops.kda", "chunk_kda") if patch is None else chunk_kda
                    got = cases.run(fn, t, do, dht, **flags)
            except Exception as e:  # noqa: BLE001  (a diagnostic: report and go on)
                print(f"  {name:26s} unavailable: {repr(e)[:160]}", flush=True)
                continue
            errs = {n: chain_fuzz.rel_rms(got[n].double(), ref[n]) for n in ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log",
                                                                 "ddt_bias") if got.get(n) is not None}
            print(f"  {name:26s} " + " ".join(f"{n} {e:.2e}" for n, e in errs.items()),
                  f"dA_log {[round(x, 6) for x in got['dA_log'].double().tolist()]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
