"""The forward scan's recompute form above K = 128 (gdn at fla's default heads, K = 256 V = 512) through
Triton's compiler for sm_90a on a machine without a GPU (``kernel_fun.bench.lowering``): BV32-w4-s2, the
autotuner's pick there on the H100, fits two programs an SM. It did not while the key-major layout loaded
k twice a chunk (k and k^T: 172 KB of shared memory; since K_ONCE 107 KB), and the scan ran 1.794 against
1.293 ms at B=8 T=8192 H=6 (docs/gdn.md, thirty-first session).

Run in a subprocess without TRITON_INTERPRET (the ``run_uninterpreted`` fixture).
"""
import textwrap

import pytest

_BODY = textwrap.dedent("""
    from kernel_fun.bench import lowering
    from kernel_fun._delta._kernels import state_scan_fwd as m

    why = lowering.ptxas_missing("sm_90a")
    if why:
        print("SKIP", why)
        raise SystemExit(0)
    for label, fn, ptr, c, cfg in lowering.SPECS["state_scan_fwd"](full=False):
        if label == "state_scan_fwd gdn_recompute K=256 BV32-w4-s2-rNone":
            assert c["BK"] == m._slice_rows(256) == 128, c["BK"]
            s = lowering.stats(fn, ptr, c, cfg.num_warps, cfg.num_stages, cfg.maxnreg, sass=False)
            print("STATS", s["regs"], s["stack_bytes"], s["shared_bytes"], s["per_sm"])
""")


def test_k256_recompute_scan_fits_two_programs_an_sm(run_uninterpreted):
    r = run_uninterpreted(_BODY, "scan_compile.py")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if "SKIP" in r.stdout:
        pytest.skip(r.stdout.split("SKIP", 1)[1].strip())
    line = next(x for x in r.stdout.splitlines() if x.startswith("STATS"))
    regs, stack, shared, per_sm = map(int, line.split()[1:])
    assert stack == 0, line
    assert per_sm >= 2 and shared <= 113 * 1024, line
