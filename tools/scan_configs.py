"""Chosen configurations of gdn's forward state scan in its recompute form (no output; h and v_new
written: the split forward's and the backward's call above K = 128), each forced, checked against the
stage reference and timed, at one shape: ``kernel-fun bench --stages gdn --kernel delta.state_scan_fwd``
restricted to that one probe (the stages bench also runs the form with the output, which at K = 256 the
chain never launches and which compiles slowly there). GPU only, from the repository root:

    PYTHONPATH=/tmp/site:src python3 tools/scan_configs.py OUT.json B=4,T=4096,H=6,HV=6,K=256,V=512 \
        VK-BV32-w4-s2-rNone BV16-w4-s1-rNone ...
"""
import json
import sys

import torch

from kernel_fun.bench import gdn, harness, stages


def main(out: str, shape: str, names: list) -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: interpreted (TRITON_INTERPRET=1), untimed
    over = dict(kv.split("=") for kv in shape.split(",")) if shape else {}
    sh = stages.stage_shape("gdn", dev, over)
    probes = [p for p in gdn.probes(dev, sh) if p.kernel == "delta.state_scan_fwd" and "h" in p.names]
    rows = stages.stage_rows("gdn", probes, timed=dev == "cuda", configs=set(names) | {"autotuned"})
    for r in rows:
        r["shape"] = sh
    rec = harness.record(rows, {}, extra={"what": f"gdn's recompute-form forward scan, forced configs, at {sh}"})
    with open(out, "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
