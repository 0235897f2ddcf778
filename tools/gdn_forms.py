#!/usr/bin/env python
"""GDN's two forward forms against each other on the GPU (``gdn/chain.py``'s ``SPLIT_ABOVE_K``): fused
(the state scan makes o along its chain of chunks) and split (the scan writes h and v_new, the
gated scores and ``chunk_output`` make o). The op's forward at the layer's call (gate, beta's
sigmoid and the l2norm in the op), each form autotuned at the shape, timed by ``harness.median_ms``,
alternated over ROUNDS, and the two outputs' distance; the peak memory of each. Shapes: fla's
default GatedDeltaNet heads (K = 256, V = 512, where the fused scan spills), the latency-bound call
(B=1 T=4096, where the fused scan runs 32-64 programs along 64 chunks) and the op bench's main one.

    python tools/gdn_forms.py OUT.json [SHAPE ...]
"""
from __future__ import annotations

import json
import sys

import torch

SHAPES = {"fla_default_heads_b8": dict(B=8, T=8192, H=6, HV=6, K=256, V=512),
          "latency_b1_t4096": dict(B=1, T=4096, H=16, HV=16, K=128, V=128),
          "prod_b8": dict(B=8, T=8192, H=16, HV=16, K=128, V=128)}
ROUNDS = 3


def main(path: str, names: list) -> int:
    from kernel_fun import gdn
    from kernel_fun._common.numerics import rel_rms
    from kernel_fun.bench.gdn import _inputs
    from kernel_fun.bench.harness import measure_ceilings, median_ms
    from kernel_fun.gdn import chain

    out = {"ceilings": measure_ceilings(), "gpu": torch.cuda.get_device_name(), "cases": {}}
    forms = {"fused": 1 << 20, "split": 0}  # SPLIT_ABOVE_K for each
    for name in names or list(SHAPES):
        s = SHAPES[name]
        t = _inputs(s["B"], s["T"], s["H"], s["HV"], s["K"], s["V"])

        def fwd():
            with torch.no_grad():
                return gdn.chunk_gated_delta_rule(
                    t["q"], t["k"], t["v"], t["g"], t["beta"], use_qk_l2norm_in_kernel=True,
                    use_beta_sigmoid_in_kernel=True, state_v_first=True, use_gate_in_kernel=True,
                    A_log=t["A_log"], dt_bias=t["dt_bias"])[0]

        row, o = {"shape": s, "ms": {f: [] for f in forms}, "peak_mb": {}}, {}
        old = chain.SPLIT_ABOVE_K
        try:
            for f, lim in forms.items():  # tune and check each form once
                chain.SPLIT_ABOVE_K = lim
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                o[f] = fwd()
                torch.cuda.synchronize()
                row["peak_mb"][f] = round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1)
            row["o_split_vs_fused"] = rel_rms(o["split"].float(), o["fused"].float())
            del o
            for _ in range(ROUNDS):
                for f, lim in forms.items():
                    chain.SPLIT_ABOVE_K = lim
                    row["ms"][f].append(round(median_ms(fwd), 4))
        finally:
            chain.SPLIT_ABOVE_K = old
        row["median_ms"] = {f: sorted(v)[len(v) // 2] for f, v in row["ms"].items()}
        row["split_over_fused"] = round(row["median_ms"]["split"] / row["median_ms"]["fused"], 3)
        out["cases"][name] = row
        print(name, json.dumps(row), flush=True)
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
