#!/usr/bin/env python
"""Compile our Triton kernels ahead of time for sm_90a on a machine without a GPU.

    python scripts/sass_stats.py intra_bwd            # registers, spills, shared memory, static
    python scripts/sass_stats.py wy_bwd | state_scan_fwd | state_scan_bwd | score_grad | gate_bwd | cconv
    python scripts/sass_stats.py all --frontend       # every config of every kernel, every flag
                                                      # combination, lowered to Triton IR only

Default mode: the production configurations (and, for intra_bwd, each fused epilogue in turn)
compiled to a cubin with the ptxas and cuobjdump that ship with the triton wheel; prints what
ptxas made of each: a proxy to check before spending device time, not a timing.

``--frontend``: lower each kernel to Triton IR (the step where Triton type-checks the kernel:
an if/else whose branches give one name two shapes, a constexpr mismatch, a missing argument).
Triton's interpreter, which runs the CPU tests, does none of those checks, so a kernel can pass
every interpreted test and still fail to compile on the GPU. Exit status 1 if any fails;
tests/common/test_frontend_compile.py runs this in CI. About 0.3 s per kernel variant.
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)


def _source(fn, pointer_types: dict, constexprs: dict) -> ASTSource:
    """``fn`` (a JITFunction) with its pointers typed (default fp32 pointers; ``T`` is i32). An
    integer typed ``"i32:16"`` is a multiple of 16, as Triton specializes a launch where one is
    (a stride or width of 2048): without it a row's address is not known aligned and its loads
    are not vectorized."""
    # a constexpr the caller leaves out takes its default, as at launch
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    sig = {n: pointer_types.get(n, "*fp32") for n in fn.arg_names}
    if "T" in sig:
        sig["T"] = "i32"
    div16 = {n for n, t in sig.items() if t.endswith(":16")}
    sig = {n: t.removesuffix(":16") for n, t in sig.items()}
    for c in constexprs:
        sig[c] = "constexpr"
    # pointers 16-byte aligned, as Triton specializes a launch on aligned tensors (without it
    # no load or store is vectorized and the counts are not the GPU's)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in div16}
    return ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
                     attrs=attrs)


def _options(num_warps, num_stages, maxnreg) -> dict:
    opts = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return opts


def lower(fn, pointer_types, constexprs, num_warps, num_stages=1, maxnreg=None):
    """Triton IR of the kernel (raises where Triton's frontend rejects it)."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(TARGET)
    options = backend.parse_options(_options(num_warps, num_stages, maxnreg))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    return _source(fn, pointer_types, constexprs).make_ir(
        TARGET, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)


def stats(fn, pointer_types, constexprs, num_warps, num_stages=1, maxnreg=None) -> dict:
    """Compile for sm_90a: registers, local memory (spills), shared memory, SASS and MUFU counts."""
    k = triton.compile(_source(fn, pointer_types, constexprs), target=TARGET,
                       options=_options(num_warps, num_stages, maxnreg))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    res = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "--dump-resource-usage", f.name],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    m = re.search(r"REG:(\d+)\s+STACK:(\d+).*?LOCAL:(\d+)", res, re.S)
    # ptxas puts spilled registers on the stack (STACK, reached by LDL/STL), not in LOCAL
    return dict(regs=int(m.group(1)), stack_bytes=int(m.group(2)), local_bytes=int(m.group(3)),
                spill_ops=len(re.findall(r"\b(?:LDL|STL)\b", sass)), shared_bytes=k.metadata.shared,
                sass=len(re.findall(r"^\s+/\*[0-9a-f]{4,6}\*/", sass, re.M)), mufu=sass.count("MUFU"))


# Each spec generator yields (label, jit function, pointer types, constexprs, config); with
# full=False only what the default mode reports (production configs), with full=True every
# configuration any launcher, bench or test can force, at every flag combination.

def _cfg_label(c) -> str:
    extra = f" r{c.maxnreg}" if getattr(c, "maxnreg", None) else ""
    return f"{c.kwargs} w{c.num_warps} s{c.num_stages}{extra}"


def intra_bwd(full):
    from kernel_fun.kda._kernels import intra_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "beta", "dq_out", "dk_out")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64")
    fusions = [("plain", ()), ("+l2norm", ("L2NORM_BWD",)),
               ("+l2norm+anchor", ("L2NORM_BWD", "ANCHOR")),
               ("+l2norm+anchor+monotone", ("L2NORM_BWD", "ANCHOR", "GATE_MONOTONE"))]
    if not full:  # the measured best at K=128: BK=128 on 4 warps, one stage
        base = dict(H=16, HV=16, K=128, BT=64, BK=128, HOIST_S=False, IS_VARLEN=False, DOT_PRECISION="tf32")
        for name, flags in fusions:
            c = dict(base, L2NORM_BWD=False, FAST_RANGE=-1.0, GATE_MONOTONE=False)
            c.update({f: True for f in flags if f != "ANCHOR"})
            if "ANCHOR" in flags:
                c["FAST_RANGE"] = m.FAST_RANGE
            yield f"intra_bwd {name}", m._intra_bwd_kernel.fn, ptr, c, triton.Config({}, num_warps=4, num_stages=1)
            if "GATE_MONOTONE" in flags:  # as shipped: also the 8-warp candidate (CANDIDATES)
                yield f"intra_bwd {name} w8", m._intra_bwd_kernel.fn, ptr, c, triton.Config({}, num_warps=8, num_stages=1)
        return
    fusions += [("+anchor", ("ANCHOR",)), ("+anchor+monotone", ("ANCHOR", "GATE_MONOTONE"))]
    for cfg, varlen, (name, flags) in itertools.product(m.CONFIGS + m.CANDIDATES, (False, True), fusions):
        if "L2NORM_BWD" in flags and cfg.kwargs["BK"] < 128:
            continue  # the fused epilogues take only whole-K blocks (the launcher prunes the rest)
        c = dict(H=16, HV=16, K=128, BT=64, IS_VARLEN=varlen, DOT_PRECISION="tf32", L2NORM_BWD=False,
                 FAST_RANGE=-1.0, GATE_MONOTONE=False, **cfg.kwargs)
        c.update({f: True for f in flags if f != "ANCHOR"})
        if "ANCHOR" in flags:
            c["FAST_RANGE"] = m.FAST_RANGE
        yield f"intra_bwd {name} varlen={varlen} {_cfg_label(cfg)}", m._intra_bwd_kernel.fn, ptr, c, cfg


def wy_bwd(full):
    from kernel_fun.kda._kernels import wy_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "v", "v_new", "beta", "A", "h", "do", "dh", "dv", "dv2")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64", scale="fp32")
    for cfg, varlen in itertools.product(m.CONFIGS + m.CANDIDATES if full else m.CONFIGS, (False, True) if full else (False,)):
        c = dict(H=16, HV=16, K=128, V=256, BT=64, IS_VARLEN=varlen, DOT_PRECISION="tf32", **cfg.kwargs)
        yield f"wy_bwd varlen={varlen} {_cfg_label(cfg)}", m._wy_bwd_kernel.fn, ptr, c, cfg


def state_scan_fwd(full):
    from kernel_fun._delta._kernels import state_scan_fwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "w", "u", "o", "Aqk", "h", "v_new")}
    ptr.update(cu_seqlens="*i64", chunk_offsets="*i64", scale="fp32", T_total="i32", N="i32")
    base = dict(HQ=16, HK=16, HV=16, K=128, V=256, BT=64, BK=64, GATE=2, Q_GATED=True, HAS_AQK=True,
                USE_H0=False, STORE_HT=False, SAVE_H=False, SAVE_V_NEW=False, STATE_V_FIRST=False,
                IS_VARLEN=False, DOT_PRECISION="tf32")
    if not full:
        for cfg in m.CONFIGS:
            yield f"state_scan_fwd {m.config_name(cfg)}", m.state_scan_fwd_kernel, ptr, dict(base, **cfg.kwargs), cfg
        return
    variants = [dict(), dict(GATE=1, Q_GATED=False), dict(GATE=0, Q_GATED=False), dict(Q_GATED=False),
                dict(USE_H0=True, STORE_HT=True, IS_VARLEN=True), dict(SAVE_H=True, SAVE_V_NEW=True, HAS_AQK=False)]
    for cfg, v in itertools.product(m.CONFIGS + m.CANDIDATES, variants):
        c = dict(base, **v, **cfg.kwargs)
        name = ",".join(f"{k}={x}" for k, x in v.items()) or "kda"
        yield f"state_scan_fwd {name} {m.config_name(cfg)}", m.state_scan_fwd_kernel, ptr, c, cfg


def state_scan_bwd(full):
    from kernel_fun._delta._kernels import state_scan_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "w", "do", "dv", "A", "dh", "dv2")}
    ptr.update(cu_seqlens="*i64", chunk_offsets="*i64", scale="fp32")
    gates = (0, 1, 2) if full else (2,)
    for cfg, gate, varlen, dva in itertools.product(m.CONFIGS + m.CANDIDATES if full else m.CONFIGS, gates, (False, True) if full else (False,),
                                                    (False, True)):
        if dva and gate != 2:
            continue  # dv from A: KDA's chain only
        c = dict(HQ=16, HK=16, HV=16, K=128, V=256, BT=64, KP=128, BV=cfg.kwargs["BV"], GATE=gate, USE_DHT=True,
                 STORE_DH0=True, IS_VARLEN=varlen, DOT_PRECISION="tf32", DV_FROM_A=dva)
        yield (f"state_scan_bwd GATE={gate} varlen={varlen} dv_from_A={dva} {m.config_name(cfg)}",
               m.state_scan_bwd_kernel, ptr, c, cfg)


def score_grad(full):
    from kernel_fun._delta._kernels import score_grad as m

    ptr = {"v": "*bf16", "do": "*bf16", "cu_seqlens": "*i64", "chunk_indices": "*i64", "scale": "fp32"}
    for cfg, varlen in itertools.product(m.CONFIGS, (False, True) if full else (False,)):
        c = dict(HV=16, V=256, BT=64, IS_VARLEN=varlen, **cfg.kwargs)
        yield f"score_grad varlen={varlen} {_cfg_label(cfg)}", m._score_grad_kernel.fn, ptr, c, cfg


def gate_bwd(full):
    from kernel_fun.kda._kernels import gate_bwd as m

    ptr = {"g_raw": "*bf16", "cu_seqlens": "*i64", "chunk_indices": "*i64"}
    for cfg, varlen, gate in itertools.product(m.CONFIGS, (False, True) if full else (False,),
                                               ((True, True), (True, False), (False, False)) if full else ((True, True),)):
        c = dict(HV=16, K=128, BT=64, IS_VARLEN=varlen, GATE=gate[0], HAS_DT_BIAS=gate[1], **cfg.kwargs)
        yield f"gate_bwd varlen={varlen} GATE/HAS_DT_BIAS={gate} {_cfg_label(cfg)}", m._gate_bwd_kernel.fn, ptr, c, cfg


def cconv(full):
    from kernel_fun.cconv._kernels import bwd, fwd

    ptr = dict(x="*bf16", y="*bf16", dy="*bf16", dx="*bf16", cu_seqlens="*i64")
    lists = (("fwd", fwd.conv_fwd_kernel, fwd._FWD_CONFIGS + (fwd._FWD_CANDIDATES if full else [])),
             ("bwd", bwd.conv_bwd_kernel, bwd._BWD_CONFIGS + (bwd._BWD_CANDIDATES if full else [])))
    for name, kernel, configs in lists:
        fn = kernel.fn
        # the production launch: D = 2048, D-major x, dy, a [D, 4] weight (s_wd = 4): strides and
        # D multiples of 16
        types = dict(ptr, **{a: "i32:16" if a in ("D", "s_xb", "s_xt", "s_gb", "s_gt") else "i32"
                             for a in fn.arg_names if a.startswith("s_") or a in ("D", "TC", "N_SEQ", "N_STEPS")})
        layouts = [dict(IS_VARLEN=False, X_TMAJOR=False, HAS_BIAS=True, SILU=True, W=4)]
        if full:
            layouts += [dict(IS_VARLEN=True, X_TMAJOR=True, HAS_BIAS=False, SILU=False, W=3),
                        dict(IS_VARLEN=False, X_TMAJOR=False, HAS_BIAS=True, SILU=True, W=1)]
        for cfg, lay in itertools.product(configs, layouts):
            c = dict(VEC16=True, **lay, **cfg.kwargs)
            # a stride of 1 is specialized as a constant at launch, as Triton does: the channel
            # stride of a D-major x (dy), the tap stride of a [D, W] weight (else the row loads
            # are not known contiguous and compile to 2-byte scalar loads)
            c["s_wi"] = 1
            c["FAST"] = True  # as launched on a GPU (fastmath.FAST_MATH)
            if not lay["X_TMAJOR"]:
                c["s_xd"] = 1
            if name == "bwd":
                c["DY_TMAJOR"] = lay["X_TMAJOR"]
                if not lay["X_TMAJOR"]:
                    c["s_gd"] = 1
            yield f"cconv {name} {lay} {_cfg_label(cfg)}", fn, types, c, cfg
    # the TMA forward (fwd._TMA_CONFIG, then the candidates): x read through a [B, T, D] descriptor, box [1, R, BD]
    fn = fwd.conv_fwd_tma_kernel  # a JITFunction (no autotuner)
    for cfg in [fwd._TMA_CONFIG] + fwd._TMA_CANDIDATES:
        types = dict(ptr, x_desc=f"tensordesc<bf16[1,{cfg.kwargs['R']},{cfg.kwargs['BD']}]>",
                     **{a: "i32:16" if a in ("D", "s_xb", "s_xt") else "i32"
                        for a in fn.arg_names if a.startswith("s_") or a in ("D", "TC", "N_SEQ", "N_STEPS")})
        lays = [dict(IS_VARLEN=False, HAS_BIAS=True, SILU=True, W=4)]
        if full:
            lays += [dict(IS_VARLEN=True, HAS_BIAS=False, SILU=False, W=3)]
        for lay in lays:
            c = dict(**lay, **cfg.kwargs, s_wi=1, FAST=True)
            yield f"cconv fwd_tma {lay} {_cfg_label(cfg)}", fn, types, c, cfg
    if full:
        fn = bwd.dw_reduce_kernel
        for has_bias in (False, True):
            yield (f"cconv dw_reduce HAS_BIAS={has_bias}", fn, dict(n_part="i32", D="i32"),
                   dict(W=4, HAS_BIAS=has_bias, BP=64, BM=128), triton.Config({}, num_warps=4))


KERNELS = {"intra_bwd": intra_bwd, "wy_bwd": wy_bwd, "state_scan_fwd": state_scan_fwd,
           "state_scan_bwd": state_scan_bwd, "score_grad": score_grad, "gate_bwd": gate_bwd, "cconv": cconv}


def main(argv) -> int:
    frontend = "--frontend" in argv
    names = [a for a in argv if not a.startswith("--")] or ["intra_bwd"]
    if names == ["all"]:
        names = list(KERNELS)
    failed = 0
    for name in names:
        for label, fn, ptr, const, cfg in KERNELS[name](full=frontend):
            args = (fn, ptr, const, cfg.num_warps, cfg.num_stages, getattr(cfg, "maxnreg", None))
            if not frontend:
                print(label, stats(*args), flush=True)
                continue
            try:
                lower(*args)
                print(f"ok     {label}", flush=True)
            except Exception as e:  # noqa: BLE001  (report every failure, then exit 1)
                failed += 1
                msg = str(e).strip().splitlines()
                print(f"FAILED {label}: {type(e).__name__}: {msg[-1] if msg else ''}", flush=True)
    if frontend:
        print(f"{failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
