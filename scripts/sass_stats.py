#!/usr/bin/env python
"""Compile a kernel ahead of time for sm_90a on a machine without a GPU and print what ptxas
made of it: registers, local memory (spills), the shared memory Triton allocates, static SASS
instructions and MUFU (special function) instructions. A proxy to check before spending device
time, not a timing.

    python scripts/sass_stats.py intra_bwd       # the KDA intra backward at K=128, BK=128, 4 warps,
                                                 # with each fused epilogue switched on in turn
    python scripts/sass_stats.py state_scan_bwd  # the backward state scan, KDA K=128 V=256, each config
    python scripts/sass_stats.py wy_bwd | state_scan_fwd | cconv   # production configs of those

Uses the ptxas and cuobjdump that ship with the triton wheel.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def stats(fn, pointer_types: dict, constexprs: dict, num_warps: int, num_stages: int = 1) -> dict:
    """Compile ``fn`` (a JITFunction) for sm_90a; pointers default to fp32, ``T`` is i32."""
    sig = {n: pointer_types.get(n, "*fp32") for n in fn.arg_names}
    sig["T"] = "i32"
    for c in constexprs:
        sig[c] = "constexpr"
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    res = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "--dump-resource-usage", f.name],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    m = re.search(r"REG:(\d+).*?LOCAL:(\d+)", res, re.S)
    return dict(regs=int(m.group(1)), local_bytes=int(m.group(2)), shared_bytes=k.metadata.shared,
                sass=len(re.findall(r"^\s+/\*[0-9a-f]{4,6}\*/", sass, re.M)), mufu=sass.count("MUFU"))


def intra_bwd():
    from kernel_fun.kda._kernels import intra_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "beta", "dq_out", "dk_out", "g_raw")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64")
    base = dict(H=16, HV=16, K=128, BT=64, BK=128, HOIST_S=False, IS_VARLEN=False, DOT_PRECISION="tf32")
    for name, flags in [("plain", ()), ("+l2norm", ("L2NORM_BWD",)), ("+l2norm+cumsum", ("L2NORM_BWD", "DG_CUMSUM")),
                        ("+l2norm+cumsum+gate", ("L2NORM_BWD", "DG_CUMSUM", "GATE_BWD", "HAS_DT_BIAS"))]:
        c = dict(base, L2NORM_BWD=False, DG_CUMSUM=False, GATE_BWD=False, HAS_DT_BIAS=False)
        c.update({f: True for f in flags})
        print(f"intra_bwd {name:22s}", stats(m._intra_bwd_kernel.fn, ptr, c, num_warps=4), flush=True)


def state_scan_bwd():
    from kernel_fun._delta._kernels import state_scan_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "w", "do", "dv", "dh", "dv2")}
    ptr.update(cu_seqlens="*i64", chunk_offsets="*i64")
    for c in m.CONFIGS:
        const = dict(HQ=16, HK=16, HV=16, K=128, V=256, BT=64, KP=128, BV=c.kwargs["BV"], GATE=2, USE_DHT=True,
                     STORE_DH0=True, IS_VARLEN=False, DOT_PRECISION="tf32")
        fn = m.state_scan_bwd_kernel
        print(f"state_scan_bwd {m.config_name(c):14s}", stats(fn, dict(ptr, scale="fp32"), const, c.num_warps,
                                                         c.num_stages), flush=True)


def wy_bwd():
    from kernel_fun.kda._kernels import wy_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "v", "v_new", "beta", "A", "h", "do", "dh", "dv", "dv2")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64", scale="fp32")
    for c in m.configs():
        const = dict(H=16, HV=16, K=128, V=256, BT=64, IS_VARLEN=False, DOT_PRECISION="tf32", **c.kwargs)
        print(f"wy_bwd {c.kwargs} w{c.num_warps} s{c.num_stages}",
              stats(m._wy_bwd_kernel.fn, ptr, const, c.num_warps, c.num_stages), flush=True)


def state_scan_fwd():
    from kernel_fun._delta._kernels import state_scan_fwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "w", "u", "o", "Aqk", "h", "v_new")}
    ptr.update(cu_seqlens="*i64", chunk_offsets="*i64", scale="fp32", T_total="i32", N="i32")
    for c in m.PRODUCTION_CONFIGS:
        const = dict(HQ=16, HK=16, HV=16, K=128, V=256, BT=64, BK=64, GATE=2, Q_GATED=True, HAS_AQK=True,
                     USE_H0=False, STORE_HT=False, SAVE_H=False, SAVE_V_NEW=False, STATE_V_FIRST=False,
                     IS_VARLEN=False, DOT_PRECISION="tf32", **c.kwargs)
        print(f"state_scan_fwd {m.config_name(c):22s}",
              stats(m.state_scan_fwd_kernel, ptr, const, c.num_warps, c.num_stages), flush=True)


def cconv():
    from kernel_fun.cconv._kernels import bwd, fwd

    ptr = dict(x="*bf16", y="*bf16", dy="*bf16", dx="*bf16", cu_seqlens="*i64")
    for name, kernel, configs in (("fwd", fwd.conv_fwd_kernel, fwd._FWD_CONFIGS),
                                  ("bwd", bwd.conv_bwd_kernel, bwd._BWD_CONFIGS)):
        fn = kernel.fn
        types = dict(ptr, **{a: "i32" for a in fn.arg_names if a.startswith("s_") or a in ("D", "TC", "N_SEQ", "N_STEPS")})
        for c in configs:
            const = dict(W=4, HAS_BIAS=True, SILU=True, IS_VARLEN=False, X_TMAJOR=False, VEC16=True, **c.kwargs)
            if name == "bwd":
                const["DY_TMAJOR"] = False
            print(f"cconv {name} {c.kwargs} w{c.num_warps}", stats(fn, types, const, c.num_warps, 1), flush=True)


KERNELS = {"intra_bwd": intra_bwd, "wy_bwd": wy_bwd, "state_scan_fwd": state_scan_fwd,
           "state_scan_bwd": state_scan_bwd, "cconv": cconv}

if __name__ == "__main__":
    KERNELS[sys.argv[1] if len(sys.argv) > 1 else "intra_bwd"]()
