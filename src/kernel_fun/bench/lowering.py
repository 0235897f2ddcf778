#!/usr/bin/env python
"""Do the shipped kernels lower for my target? Triton's compiler on a machine without a GPU.

    kernel-fun check --lower sm_90a | sm_100a | all

Triton compiles for a named ``GPUTarget("cuda", 90 | 100, 32)``, and its wheel ships a ptxas for
each (``ptxas`` and ``ptxas-blackwell`` in Triton 3.6; 3.9 uses ``ptxas-blackwell``, CUDA 13, for
both), so no GPU is needed. Two depths:

- ``compile``: every shipped configuration (what each autotuner sees, or a launcher's fixed one)
  all the way to a cubin: Triton's GPU passes for the target, LLVM, ptxas. What
  ``kernel-fun check --lower`` runs. Kernels no call launches on the target are left out, with
  a ``skip`` line saying why (kda's, gdn's and ``_delta``'s on sm_100a below Triton 3.8, where
  those families route to fla: ``held_back``).
- ``frontend``: every configuration any launcher, bench or test can force (``CONFIGS`` and
  ``CANDIDATES``), at every flag combination, lowered to Triton IR only: the step where Triton
  type-checks a kernel (an if/else whose branches give one name two shapes, a constexpr
  mismatch, a missing argument). Triton's interpreter, which runs the CPU tests, does none of
  those checks, so a kernel can pass every interpreted test and still fail to compile on a GPU.
  Each distinct Triton IR once (configs that differ only in warps or stages share it), about
  0.3 s each; ``--except-shipped`` leaves out what ``compile`` builds.

Both check coverage: every kernel the package ships (``discover``: the ``*_kernel`` objects of
each ``kernel_fun.<pkg>._kernels`` module) has a spec here, and every configuration its
autotuner sees has one; a kernel or config without one counts as a failure.
Runs only where TRITON_INTERPRET is unset (kernels must be real ``triton.jit`` functions).
``stats`` reads registers and spills back from a cubin (tools/sass_stats.py prints them).
"""
from __future__ import annotations

import itertools
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernel_fun._common.hardware import DOT_FAMILIES, dot_reason

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGETS = {"sm_90a": GPUTarget("cuda", 90, 32), "sm_100a": GPUTarget("cuda", 100, 32)}
TARGET = TARGETS["sm_90a"]
# The packages whose kernels only the ``hardware.DOT_FAMILIES`` launch: those families and the engine
# they share. On a target where those families route to fla (Blackwell below Triton 3.8:
# ``hardware.dot_reason``) no call launches these kernels, and the compile leaves them out, saying so.
DOT_PACKAGES = (*DOT_FAMILIES, "_delta")


def source(fn, pointer_types: dict, constexprs: dict) -> ASTSource:
    """``fn`` (a JITFunction) with its pointers typed (default fp32 pointers; ``T`` is i32). An
    integer typed ``"i32:16"`` is a multiple of 16, as Triton specializes a launch where one is
    (a stride or width of 2048): without it a row's address is not known aligned and its loads
    are not vectorized."""
    # a constexpr the caller leaves out takes its default, as at launch
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    sig = {n: pointer_types.get(n, "*fp32") for n in fn.arg_names}
    for n in ("T", "NT", "WORK"):  # WORK: the delta-rule kernels' autotune key (tuning.work_bucket); NT: chunks
        if n in sig:
            sig[n] = "i32"
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


def options(num_warps, num_stages, maxnreg) -> dict:
    opts = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return opts


def lower(fn, pointer_types, constexprs, num_warps, num_stages=1, maxnreg=None, target=None):
    """Triton IR of the kernel (raises where Triton's frontend rejects it)."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    target = target or TARGET
    backend = make_backend(target)
    opts = backend.parse_options(options(num_warps, num_stages, maxnreg))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    return source(fn, pointer_types, constexprs).make_ir(
        target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context)


def build(fn, pointer_types, constexprs, num_warps, num_stages=1, maxnreg=None, target=None):
    """The kernel compiled to a cubin for ``target`` (default sm_90a): Triton's compiled kernel."""
    return triton.compile(source(fn, pointer_types, constexprs), target=target or TARGET,
                          options=options(num_warps, num_stages, maxnreg))


# What bounds the programs resident on one SM, the same for sm_90 and sm_100 (CUDA C++ Programming
# Guide, compute capabilities 9.0 and 10.0): 64 K registers, allocated a warp at a time in units
# of 256; 228 KB of shared memory, of which each program also takes 1 KB for the system; 64 warps;
# 32 programs.
SM_REGISTERS, SM_SHARED, SHARED_RESERVED, SM_WARPS, SM_PROGRAMS = 65536, 228 * 1024, 1024, 64, 32


def programs_per_sm(regs: int, shared_bytes: int, num_warps: int) -> int:
    """How many programs of a kernel fit on one SM at once (occupancy in programs), from its
    registers a thread, its shared memory and its warps: the least of the four bounds."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = SM_REGISTERS // (per_warp * num_warps)
    by_shared = SM_SHARED // (shared_bytes + SHARED_RESERVED)
    return min(by_regs, by_shared, SM_WARPS // num_warps, SM_PROGRAMS)


def stats(fn, pointer_types, constexprs, num_warps, num_stages=1, maxnreg=None, target=None, sass=True) -> dict:
    """Compile for ``target`` (default sm_90a) and read the cubin back with the wheel's cuobjdump:
    registers, stack (spills), local memory, spill instructions, shared memory, programs an SM
    (``programs_per_sm``), SASS and MUFU counts (tests hold kernels to no spills;
    tools/sass_stats.py prints them). ``sass=False`` skips the disassembly (about 0.5 s a kernel):
    the instruction counts are then None."""
    import re
    import subprocess
    import tempfile

    k = build(fn, pointer_types, constexprs, num_warps, num_stages, maxnreg, target)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    tool = os.path.join(TOOLS, "cuobjdump")
    res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    code = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout if sass else None
    os.unlink(f.name)
    m = re.search(r"REG:(\d+)\s+STACK:(\d+).*?LOCAL:(\d+)", res, re.S)
    # ptxas puts spilled registers on the stack (STACK, reached by LDL/STL), not in LOCAL
    out = dict(regs=int(m.group(1)), stack_bytes=int(m.group(2)), local_bytes=int(m.group(3)),
               shared_bytes=k.metadata.shared, spill_ops=None, sass=None, mufu=None)
    out["per_sm"] = programs_per_sm(out["regs"], out["shared_bytes"], num_warps)
    if code is not None:
        out.update(spill_ops=len(re.findall(r"\b(?:LDL|STL)\b", code)),
                   sass=len(re.findall(r"^\s+/\*[0-9a-f]{4,6}\*/", code, re.M)), mufu=code.count("MUFU"))
    return out


# Each spec generator yields (label, jit function, pointer types, constexprs, config); with
# full=False only what the default mode reports (production configs), with full=True every
# configuration any launcher, bench or test can force, at every flag combination.

def shipped_configs(kernel) -> list:
    """The configurations a kernel is launched with on a GPU: its autotuner's list (Triton's
    ``Autotuner.configs``; outside the interpreter ``tuning.autotune_configs`` passes them all)."""
    from triton.runtime.autotuner import Autotuner

    while not isinstance(kernel, Autotuner):
        if not hasattr(kernel, "fn"):
            raise TypeError(f"{kernel!r} is not autotuned")
        kernel = kernel.fn
    return list(kernel.configs)


def candidates(m, kernel, prefix: str = "") -> list:
    """The configurations a bench may force beyond the shipped ones (module ``m``'s
    ``<prefix>CANDIDATES``, the config convention of ``_common/tuning.py``), those whose
    parameters are ``kernel``'s constexprs."""
    fn = _jit_fn(kernel)
    params = {p.name for p in fn.params if p.is_constexpr}
    return [c for c in getattr(m, prefix + "CANDIDATES") if set(c.kwargs) <= params]


def _jit_fn(kernel):
    """The ``triton.jit`` function under an autotuner or heuristics wrapper."""
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def cfg_label(c) -> str:
    extra = f" r{c.maxnreg}" if getattr(c, "maxnreg", None) else ""
    return f"{c.kwargs} w{c.num_warps} s{c.num_stages}{extra}"


def intra_bwd(full):
    from kernel_fun.kda._kernels import intra_bwd as m
    from kernel_fun.kda.chain import INTRA_BWD_DOTS  # the chain's dots (fp32)

    ptr = {n: "*bf16" for n in ("q", "k", "beta", "dq_out", "dk_out")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64")
    fusions = [("plain", ()), ("+l2norm", ("L2NORM_BWD",)),
               ("+l2norm+anchor", ("L2NORM_BWD", "ANCHOR")),
               ("+l2norm+anchor+monotone", ("L2NORM_BWD", "ANCHOR", "GATE_MONOTONE"))]
    if not full:  # the measured best at K=128: BK=128 on 4 warps, one stage
        base = dict(H=16, HV=16, K=128, BT=64, BK=128, HOIST_S=False, IS_VARLEN=False, DOT_PRECISION=INTRA_BWD_DOTS)
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
        c = dict(H=16, HV=16, K=128, BT=64, IS_VARLEN=varlen, DOT_PRECISION=INTRA_BWD_DOTS, L2NORM_BWD=False,
                 FAST_RANGE=-1.0, GATE_MONOTONE=False, **cfg.kwargs)
        c.update({f: True for f in flags if f != "ANCHOR"})
        if "ANCHOR" in flags:
            c["FAST_RANGE"] = m.FAST_RANGE
        yield f"intra_bwd {name} varlen={varlen} {cfg_label(cfg)}", m._intra_bwd_kernel.fn, ptr, c, cfg


def wy_bwd(full):
    from kernel_fun.kda._kernels import wy_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "v", "v_new", "beta", "A", "h", "do", "dh", "dv", "dv2")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64", scale="fp32")
    for cfg, varlen in itertools.product(m.CONFIGS + m.CANDIDATES if full else m.CONFIGS, (False, True) if full else (False,)):
        c = dict(H=16, HV=16, K=128, V=256, BT=64, IS_VARLEN=varlen, DOT_PRECISION="tf32", **cfg.kwargs)
        yield f"wy_bwd varlen={varlen} {cfg_label(cfg)}", m._wy_bwd_kernel.fn, ptr, c, cfg


def state_scan_fwd(full):
    from kernel_fun._delta._kernels import state_scan_fwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "w", "u", "o", "Aqk", "h", "v_new")}
    ptr.update(cu_seqlens="*i64", chunk_offsets="*i64", seq_order="*i32", scale="fp32", T_total="i32", N="i32",
               beta="*fp32")  # (the activated beta of the layer's call)
    base = dict(HQ=16, HK=16, HV=16, K=128, V=256, BT=64, BK=64, GATE=2, Q_GATED=True, HAS_AQK=True,
                USE_H0=False, STORE_HT=False, STORE_O=True, SAVE_H=False, SAVE_V_NEW=False, STATE_V_FIRST=False,
                IS_VARLEN=False, DOT_PRECISION="tf32")
    # GDN's shipped calls: the forward (scalar gate, scores made inside, v_new from A, v, beta)
    # and the backward's recompute (h and v_new written, no output), at the layer's K = V = 128
    gdn = dict(GATE=1, Q_GATED=False, HAS_AQK=False, V=128, WY_FROM_A=True)
    gdn_recompute = dict(gdn, STORE_O=False, SAVE_H=True, SAVE_V_NEW=True, USE_H0=True)
    # fla's default GatedDeltaNet heads (6 of K = 256, V = 512): the split forward's scan and the
    # backward's recompute, no output, in the configurations kept above K = 128 (``prune_by_k``)
    k256 = dict(gdn_recompute, HQ=6, HK=6, HV=6, K=256, V=512, BK=m._slice_rows(256))  # the launcher's BK there
    for cfg in (c for c in m.CONFIGS if m.config_name(c) in m._WIDE):
        yield f"state_scan_fwd gdn_recompute K=256 {m.config_name(cfg)}", m.state_scan_fwd_kernel, ptr, dict(
            base, **k256, **cfg.kwargs), cfg
    if not full:
        for cfg in m.CONFIGS:
            yield f"state_scan_fwd {m.config_name(cfg)}", m.state_scan_fwd_kernel, ptr, dict(base, **cfg.kwargs), cfg
            for name, v in (("gdn", gdn), ("gdn_recompute", gdn_recompute)):
                yield (f"state_scan_fwd {name} {m.config_name(cfg)}", m.state_scan_fwd_kernel, ptr,
                       dict(base, **v, **cfg.kwargs), cfg)
        return
    variants = [dict(), dict(GATE=1, Q_GATED=False), dict(GATE=0, Q_GATED=False), dict(Q_GATED=False),
                dict(USE_H0=True, STORE_HT=True, IS_VARLEN=True), dict(SAVE_H=True, SAVE_V_NEW=True, HAS_AQK=False),
                gdn_recompute, dict(gdn_recompute, IS_VARLEN=True), gdn, dict(gdn, IS_VARLEN=True, USE_H0=True),
                dict(gdn, WY_FROM_A=False), dict(gdn_recompute, WY_FROM_A=False)]
    for cfg, v in itertools.product(m.CONFIGS + m.CANDIDATES, variants):
        c = dict(base, **v, **cfg.kwargs)
        name = ",".join(f"{k}={x}" for k, x in v.items()) or "kda"
        yield f"state_scan_fwd {name} {m.config_name(cfg)}", m.state_scan_fwd_kernel, ptr, c, cfg


def state_scan_bwd(full):
    from kernel_fun._delta._kernels import state_scan_bwd as m

    ptr = {n: "*bf16" for n in ("q", "k", "w", "do", "dv", "A", "dh", "dv2")}
    # beta fp32: the activated beta the layer's call (the sigmoid in the op) hands the chain
    ptr.update(cu_seqlens="*i64", chunk_offsets="*i64", seq_order="*i32", scale="fp32", beta="*fp32")
    # GDN's call: the scalar gate, dv from its gated scores, at the layer's V = 128; w from A_wy and
    # beta (wy=, the chain's, with the scores and A_wy zero above the diagonal: A_TRIL) or read
    for cfg, varlen, wy in itertools.product(m.CONFIGS + m.CANDIDATES if full else m.CONFIGS,
                                             (False, True) if full else (False,), (False, True)):
        c = dict(HQ=16, HK=16, HV=16, K=128, V=128, BT=64, KP=128, GATE=1, USE_DHT=True,
                 STORE_DH0=True, IS_VARLEN=varlen, DOT_PRECISION="tf32", DV_FROM_A=True, WY_FROM_A=wy,
                 A_TRIL=wy, **cfg.kwargs)
        yield (f"state_scan_bwd gdn varlen={varlen} wy={wy} {m.config_name(cfg)}", m.state_scan_bwd_kernel, ptr, c, cfg)
    for cfg in (c for c in m.CONFIGS if m.config_name(c) in m._WIDE):  # fla's default heads, as above
        c = dict(HQ=6, HK=6, HV=6, K=256, V=512, BT=64, KP=256, GATE=1, USE_DHT=True, STORE_DH0=True,
                 IS_VARLEN=False, DOT_PRECISION="tf32", DV_FROM_A=True, WY_FROM_A=True, A_TRIL=True, **cfg.kwargs)
        yield f"state_scan_bwd gdn K=256 {m.config_name(cfg)}", m.state_scan_bwd_kernel, ptr, c, cfg
    gates = (0, 1, 2) if full else (2,)
    for cfg, gate, varlen, dva in itertools.product(m.CONFIGS + m.CANDIDATES if full else m.CONFIGS, gates, (False, True) if full else (False,),
                                                    (False, True)):
        if dva and gate != 2:
            continue  # dv from A: KDA's chain only
        c = dict(HQ=16, HK=16, HV=16, K=128, V=256, BT=64, KP=128, GATE=gate, USE_DHT=True,
                 STORE_DH0=True, IS_VARLEN=varlen, DOT_PRECISION="tf32", DV_FROM_A=dva, **cfg.kwargs)
        yield (f"state_scan_bwd GATE={gate} varlen={varlen} dv_from_A={dva} {m.config_name(cfg)}",
               m.state_scan_bwd_kernel, ptr, c, cfg)


def score_grad(full):
    from kernel_fun._delta._kernels import score_grad as m

    ptr = {"v": "*bf16", "do": "*bf16", "cu_seqlens": "*i64", "chunk_indices": "*i64", "scale": "fp32"}
    for cfg, varlen in itertools.product(m.CONFIGS + (m.CANDIDATES if full else []), (False, True) if full else (False,)):
        c = dict(HV=16, V=256, BT=64, IS_VARLEN=varlen, **cfg.kwargs)
        yield f"score_grad varlen={varlen} {cfg_label(cfg)}", m._score_grad_kernel.fn, ptr, c, cfg


def gate_bwd(full):
    from kernel_fun.kda._kernels import gate_bwd as m

    ptr = {"g_raw": "*bf16", "cu_seqlens": "*i64", "chunk_indices": "*i64"}
    for cfg, varlen, gate in itertools.product(m.CONFIGS + (m.CANDIDATES if full else []), (False, True) if full else (False,),
                                               ((True, True), (True, False), (False, False)) if full else ((True, True),)):
        c = dict(HV=16, K=128, BT=64, IS_VARLEN=varlen, GATE=gate[0], HAS_DT_BIAS=gate[1], **cfg.kwargs)
        yield f"gate_bwd varlen={varlen} GATE/HAS_DT_BIAS={gate} {cfg_label(cfg)}", m._gate_bwd_kernel.fn, ptr, c, cfg


def cconv(full):
    from kernel_fun.cconv._kernels import bwd, fwd

    ptr = dict(x="*bf16", y="*bf16", dy="*bf16", dx="*bf16", cu_seqlens="*i64")
    # shipped: what the autotuner sees; then the candidates
    lists = (("fwd", fwd.conv_fwd_kernel, shipped_configs(fwd.conv_fwd_kernel) + (
                 candidates(fwd, fwd.conv_fwd_kernel) if full else [])),
             ("bwd", bwd.conv_bwd_kernel, shipped_configs(bwd.conv_bwd_kernel) + (
                 candidates(bwd, bwd.conv_bwd_kernel) if full else [])))
    for name, kernel, configs in lists:
        fn = kernel.fn
        # the production launch: D = 2048, D-major x, dy, a [D, 4] weight (s_wd = 4): strides and
        # D multiples of 16
        types = dict(ptr, **{a: "i32:16" if a in ("D", "s_xb", "s_xt", "s_gb", "s_gt") else "i32"
                             for a in fn.arg_names if a.startswith("s_") or a in ("D", "TC", "N_SEQ", "N_STEPS", "TC_BUCKET")})
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
            yield f"cconv {name} {lay} {cfg_label(cfg)}", fn, types, c, cfg
    # the TMA forward (fwd.TMA_CONFIGS, then TMA_CANDIDATES): x read through a [B, T, D] descriptor, box [1, R, BD]
    fn = fwd.conv_fwd_tma_kernel  # a JITFunction (no autotuner): its launcher's fixed config
    tma = list(fwd.TMA_CONFIGS)
    if full:
        tma += candidates(fwd, fn, "TMA_")
    for cfg in tma:
        types = dict(ptr, x_desc=f"tensordesc<bf16[1,{cfg.kwargs['R']},{cfg.kwargs['BD']}]>",
                     **{a: "i32:16" if a in ("D", "s_xb", "s_xt") else "i32"
                        for a in fn.arg_names if a.startswith("s_") or a in ("D", "TC", "N_SEQ", "N_STEPS")})
        lays = [dict(IS_VARLEN=False, HAS_BIAS=True, SILU=True, W=4)]
        if full:
            lays += [dict(IS_VARLEN=True, HAS_BIAS=False, SILU=False, W=3)]
        for lay in lays:
            c = dict(**lay, **cfg.kwargs, s_wi=1, FAST=True)
            yield f"cconv fwd_tma {lay} {cfg_label(cfg)}", fn, types, c, cfg
    fn = bwd.dw_reduce_kernel  # one fixed config (conv_bwd): the summation order must not vary
    for has_bias in (False, True) if full else (True,):
        yield (f"cconv dw_reduce HAS_BIAS={has_bias}", fn, dict(n_part="i32", D="i32"),
               dict(W=4, HAS_BIAS=has_bias, BP=64, BM=128), triton.Config({}, num_warps=4))


# gdn: production H = 16 with HV = 16 (G = 1) and HV = 32 (G = 2: wy_dqk_bwd's group loop and
# its G > 1 branch), K = V = 128, bf16 q/k/v/h/A, fp32 gate, activated beta (fla's sigmoid
# kernel writes fp32) and fp32 dbeta/dg; one program per chunk as the launchers grid it. The
# autotuned wrappers (``*_kernel_tuned``) hold CONFIGS; all of them fit V = 128 (prune_bv).
_GDN_FP32 = ("g", "beta", "db", "dgz", "dg")


def _gdn_specs(name, m, kernel, full, grouped=False):
    fn = _jit_fn(kernel)
    ptr = {n: "*fp32" if n in _GDN_FP32 else "*bf16" for n in fn.arg_names}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64", scale="fp32")
    if "s_dv" in ptr:  # dv's row stride: HV * V, or the fused q/k/v gradient's row (multiples of 16)
        ptr["s_dv"] = "i32:16"
    # HV = 32 changes code only where G = HV / H is a loop bound (``grouped``: wy_dqk_bwd's and
    # gated_scores' group loops); elsewhere it is one more stride constant, compiled only in the full list
    hvs = (16, 32) if full or grouped else (16,)
    for cfg, hv, varlen in itertools.product(m.CONFIGS + (m.CANDIDATES if full else []), hvs, (False, True) if full else (False,)):
        c = dict(H=16, HV=hv, K=128, BT=64, IS_VARLEN=varlen, DOT_PRECISION="tf32", **cfg.kwargs)
        if "KP" in fn.arg_names:
            c["KP"] = 128
        if "V" in fn.arg_names:
            c["V"] = 128
        if "GP" in fn.arg_names:  # the group's gates padded to a power of two (gated_scores)
            c["GP"] = m.group_pad(hv // 16)
        yield f"{name} HV={hv} varlen={varlen} {cfg_label(cfg)}", fn, ptr, c, cfg


def gdn_scores(full):
    from kernel_fun.gdn._kernels import scores as m

    yield from _gdn_specs("gdn_scores", m, m.gated_scores_kernel, full, grouped=True)


def gdn_wy_dv(full):
    from kernel_fun.gdn._kernels import wy_dv_bwd as m

    yield from _gdn_specs("gdn_wy_dv", m, m.wy_dv_bwd_kernel, full)


def gdn_wy_dqk(full):
    from kernel_fun.gdn._kernels import wy_dqk_bwd as m

    for label, fn, ptr, c, cfg in _gdn_specs("gdn_wy_dqk", m, m.wy_dqk_bwd_kernel, full, grouped=True):
        yield label, fn, ptr, c, cfg
        if c["HV"] > c["H"]:  # the autograd's form at grouped values: a program per value head
            yield label + " PER_HEAD", fn, ptr, dict(c, PER_HEAD=True), cfg


def gdn_wy_inverse(full):
    from kernel_fun.gdn._kernels import wy_inverse as m

    yield from _gdn_specs("gdn_wy_inverse", m, m.wy_inverse_kernel, full, grouped=True)


def gdn_output(full):
    """The split forward's output kernel (``gdn/chain.py`` above K = 128) at fla's default
    GatedDeltaNet heads (H = HV = 6, K = 256, V = 512); the full list adds K = 128 and packed documents."""
    from kernel_fun.gdn._kernels import output as m

    fn = _jit_fn(m.chunk_output_kernel)
    ptr = {n: "*fp32" if n == "g" else "*bf16" for n in fn.arg_names}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i64", scale="fp32")
    for cfg, K, varlen in itertools.product(m.CONFIGS + (m.CANDIDATES if full else []), (256, 128) if full else (256,),
                                            (False, True) if full else (False,)):
        c = dict(H=6, HV=6, K=K, V=512, BT=64, IS_VARLEN=varlen, DOT_PRECISION="tf32", **cfg.kwargs)
        yield f"gdn_output K={K} varlen={varlen} {cfg_label(cfg)}", fn, ptr, c, cfg


def gdn_inputs(full):
    """The inputs' kernels (``gdn.chain.inputs_forward`` / ``inputs_backward``) at the layer's call: H = 16, HV = 32,
    K = 128, bf16 q/k/g/beta, fp32 A_log/dt_bias/rstd/gc/beta/dbeta/dg; full: packed documents, the
    precomputed gate without the sigmoid."""
    from kernel_fun.gdn._kernels import inputs_bwd as b
    from kernel_fun.gdn._kernels import inputs_fwd as f

    fp32 = ("A_log", "dt_bias", "q_rstd", "k_rstd", "gc", "beta_out", "dbeta", "dg", "part")
    flags = [dict(GATE_IN_KERNEL=True, HAS_DT_BIAS=True, BETA_SIGMOID=True, IS_VARLEN=False)]
    if full:
        flags += [dict(GATE_IN_KERNEL=True, HAS_DT_BIAS=True, BETA_SIGMOID=True, IS_VARLEN=True),
                  dict(GATE_IN_KERNEL=False, HAS_DT_BIAS=False, BETA_SIGMOID=False, IS_VARLEN=False)]
    for name, m, kernel in (("fwd", f, f.inputs_fwd_kernel), ("bwd", b, b.inputs_bwd_kernel)):
        fn = _jit_fn(kernel)
        ptr = {n: ("*fp32" if n in fp32 else "*bf16") for n in fn.arg_names}
        # the strides: multiples of 16 at the layer's call (the fused q/k/v row, H * K, K), which Triton
        # specializes at launch; without it the q, k, v loads compile to 2-byte accesses
        ptr.update({n: ("i32:16" if n.startswith("s_") else "i32") for n in ptr if n == "T" or n.startswith("s_")},
                   **{n: "fp32" for n in ("gate_scale", "beta_scale", "eps") if n in ptr},
                   cu_seqlens="*i64", chunk_indices="*i64")
        for cfg, fl in itertools.product(m.CONFIGS + (m.CANDIDATES if full else []), flags):
            c = dict(H=16, HV=32, K=128, KP=128, BT=64, RB=f.rows_per_head(64, 2), **fl, **cfg.kwargs)
            if name == "fwd":  # the layer's v: a column slice of the fused q/k/v buffer, copied
                c.update(COPY_V=True, V=128, VP=128)
            yield f"gdn_inputs {name} {fl} {cfg_label(cfg)}", fn, ptr, c, cfg


def gnorm(full):
    """gnorm's three kernels at the production widths (V = 128, 256), bf16 activations, fp32
    weight/bias/rstd. Shipped: every autotuner config (each a tile shape) at the layers' call
    (weight, no bias, no residual, no prenorm), twice: swish at V = 128, sigmoid at V = 256
    (both widths and both gates at half the compile time of every pairing). Full: adds every flag combination the launchers
    can pass (weight, bias; fwd residual in / stored: none, both, stored alone under
    residual_in_fp32; bwd prenorm gradient in / residual gradient stored apart) at one config."""
    from kernel_fun.gnorm._kernels import bwd, dw_reduce, fwd
    from kernel_fun.gnorm._kernels.common import block_v, rows_per_tile

    # row strides: V or a wider row of a fused projection, multiples of 16 at these widths
    fwd_ptr = dict(x="*bf16", g="*bf16", y="*bf16", res="*bf16", res_out="*fp32", w="*fp32", b="*fp32",
                   rstd="*fp32", N="i32", eps="fp32", s_x="i32:16", s_g="i32:16", s_r="i32:16")
    bwd_ptr = dict(h="*bf16", g="*bf16", dy="*bf16", dres="*bf16", dx="*bf16", dg="*bf16", dres_in="*fp32",
                   w="*fp32", b="*fp32", rstd="*fp32", part="*fp32", flag="*i32", N="i32", s_h="i32:16", s_g="i32:16",
                   s_dy="i32:16", s_dres="i32:16")
    layer_fwd = dict(HAS_W=True, HAS_B=False, HAS_RES=False, STORE_RES=False)
    layer_bwd = dict(HAS_W=True, HAS_B=False, HAS_DRES=False, STORE_DRES=False)
    wb = list(itertools.product((False, True), repeat=2))
    fwd_flags = [dict(HAS_W=w, HAS_B=b, HAS_RES=r, STORE_RES=s) for (w, b), (r, s)
                 in itertools.product(wb, ((False, False), (True, True), (False, True)))]
    bwd_flags = [dict(HAS_W=w, HAS_B=b, HAS_DRES=r, STORE_DRES=s) for (w, b), (r, s)
                 in itertools.product(wb, itertools.product((False, True), repeat=2))]
    for name, kernel, ptr, layer, flags in (("fwd", fwd.gnorm_fwd_kernel, fwd_ptr, layer_fwd, fwd_flags),
                                            ("bwd", bwd.gnorm_bwd_kernel, bwd_ptr, layer_bwd, bwd_flags)):
        fn = _jit_fn(kernel)
        configs = shipped_configs(kernel)
        runs = [(cfg, V, gate, layer) for cfg, (V, gate) in itertools.product(configs, ((128, 0), (256, 1)))]
        if full:
            runs += [(configs[0], 256, 0, f) for f in flags if f != layer]
        for cfg, V, gate, f in runs:
            BV = block_v(V)
            # BR: the kernel's heuristic; N_BUCKET only keys the autotuner; FAST as on a GPU
            c = dict(V=V, BV=BV, GATE=gate, **f, N_BUCKET=2, BR=rows_per_tile(cfg.kwargs["TILE"], BV), FAST=True,
                     **cfg.kwargs)
            flag_s = "".join(k for k, v in f.items() if v).replace("HAS_", "+").replace("STORE_", "+store_") or "-"
            yield f"gnorm {name} V={V} gate={gate} {flag_s} {cfg_label(cfg)}", fn, ptr, c, cfg
    # dw_reduce: dw_reduce.dw_reduce's fixed launch (BP=32, BM=128, 4 warps); V is a runtime
    # int (a multiple of 16 at either width: one compile serves both)
    for hw, hb in ((True, False), (False, True), (True, True)) if full else ((True, False),):
        yield (f"gnorm dw_reduce HAS_W={hw} HAS_B={hb}", dw_reduce.dw_reduce_kernel,
               dict(part="*fp32", dw="*fp32", db="*fp32", n_part="i32", V="i32:16"),
               dict(HAS_W=hw, HAS_B=hb, BP=32, BM=128), triton.Config({}, num_warps=4))


SPECS = {"intra_bwd": intra_bwd, "wy_bwd": wy_bwd, "state_scan_fwd": state_scan_fwd,
           "state_scan_bwd": state_scan_bwd, "score_grad": score_grad, "gate_bwd": gate_bwd, "cconv": cconv,
           "gdn_scores": gdn_scores, "gdn_wy_dv": gdn_wy_dv, "gdn_wy_dqk": gdn_wy_dqk, "gdn_inputs": gdn_inputs,
           "gdn_wy_inverse": gdn_wy_inverse, "gdn_output": gdn_output,
           "gnorm": gnorm}


def discover() -> dict:
    """Every kernel the package ships, found by the convention the code follows: the objects
    named ``*_kernel`` that each module of a ``kernel_fun.<pkg>._kernels`` package defines
    (jit functions, or autotuners around them). {"<module>.<name>": (jit function, shipped
    configs or None)}: an autotuned kernel's shipped configs are its autotuner's list (also for a
    plain jit kernel that an autotuner of its module wraps); None for a kernel its launcher runs
    with a fixed configuration."""
    import importlib
    import pkgutil

    import kernel_fun
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    found = {}
    for pkg in pkgutil.iter_modules(kernel_fun.__path__):
        if not pkg.ispkg:
            continue
        try:
            kpkg = importlib.import_module(f"kernel_fun.{pkg.name}._kernels")
        except ModuleNotFoundError as e:
            if e.name == f"kernel_fun.{pkg.name}._kernels":
                continue  # a package without kernels
            raise
        mods = [kpkg] + [importlib.import_module(f"{kpkg.__name__}.{m.name}") for m in pkgutil.iter_modules(kpkg.__path__)]
        for m in mods:
            # an autotuner the module builds around its plain ``*_kernel`` (``*_kernel_tuned``,
            # which a forced config bypasses): that kernel's shipped configs are its list
            tuned = {id(_jit_fn(o)): shipped_configs(o) for o in vars(m).values() if isinstance(o, Autotuner)}
            for name, obj in vars(m).items():
                if not name.endswith("_kernel") or not hasattr(obj, "fn") and not isinstance(obj, JITFunction):
                    continue
                fn = _jit_fn(obj)
                if fn.fn.__module__ != m.__name__:
                    continue  # imported from the module that defines it
                cfgs = tuned.get(id(fn)) if isinstance(obj, JITFunction) else shipped_configs(obj)
                found[f"{m.__name__.removeprefix('kernel_fun.')}.{name}"] = (fn, cfgs)
    return found


def _covers(spec, fn, cfg) -> bool:
    """Whether spec compiles ``fn`` at configuration ``cfg`` (its constexpr values, warps,
    stages and register cap)."""
    _, sfn, _, const, scfg = spec
    return (_jit_fn(sfn) is fn and all(const.get(k, scfg.kwargs.get(k)) == v for k, v in cfg.kwargs.items())
            and (scfg.num_warps, scfg.num_stages, getattr(scfg, "maxnreg", None))
            == (cfg.num_warps, cfg.num_stages, getattr(cfg, "maxnreg", None)))


def uncovered(specs) -> list[str]:
    """What ``discover`` finds that ``specs`` (spec tuples) leave out: a kernel without a spec,
    or a configuration of its autotuner no spec compiles."""
    missing = []
    for name, (fn, cfgs) in discover().items():
        mine = [sp for sp in specs if _jit_fn(sp[1]) is fn]
        if not mine:
            missing.append(f"{name}: no spec in kernel_fun/bench/lowering.py")
            continue
        missing += [f"{name}: config {cfg_label(c)} has no spec" for c in cfgs or ()
                    if not any(_covers(sp, fn, c) for sp in mine)]
    return missing


def shipped_specs() -> list:
    """Every shipped configuration of every kernel, once: the default mode's specs (the
    production flags) and, for an autotuner config those leave out, the first spec of the
    full list that compiles it. What ``--compile`` builds for each target."""
    specs = [sp for name in SPECS for sp in SPECS[name](full=False)]
    full = None
    for _, (fn, cfgs) in discover().items():
        for c in cfgs or ():
            if any(_covers(sp, fn, c) for sp in specs):
                continue
            if full is None:
                full = [sp for name in SPECS for sp in SPECS[name](full=True)]
            specs += [sp for sp in full if _covers(sp, fn, c)][:1]
    return specs


def ptxas_missing(target: str) -> str | None:
    """Why this Triton cannot assemble for ``target`` (``"sm_90a"``) here; None when it can."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        path = get_ptxas(TARGETS[target].arch).path
    except Exception as e:  # noqa: BLE001  (a missing tool raises from the knob)
        return f"no ptxas for {target} in this Triton: {e}"
    return None if path and os.path.exists(path) else f"no ptxas for {target} in this Triton ({path})"


_WORK: list = []  # (label, target name, spec args, mode) for the worker processes (fork)


def _check(i: int) -> str:
    """Lower (frontend) or compile work item i: its report line."""
    import time

    label, tname, args, mode = _WORK[i]
    t0 = time.perf_counter()
    try:
        (lower if mode == "frontend" else build)(*args, target=TARGETS[tname])
        return f"ok     {tname} {label} ({time.perf_counter() - t0:.1f} s)"
    except Exception as e:  # noqa: BLE001  (report every failure, then count it)
        msg = str(e).strip().splitlines()
        return f"FAILED {tname} {label}: {type(e).__name__}: {msg[-1] if msg else ''}"


def held_back(tname: str, version: tuple | None = None) -> str:
    """Why no call launches the kernels of ``DOT_PACKAGES`` on target ``tname`` under Triton
    ``version`` (default: the installed one); "" where they run."""
    arch = TARGETS[tname].arch
    return dot_reason((arch // 10, arch % 10), version)


def package(fn) -> str:
    """The ``kernel_fun`` package that defines a kernel (``"kda"``, ``"_delta"``, ...)."""
    return _jit_fn(fn).fn.__module__.split(".")[1]


def _ir_key(fn, ptr, const) -> tuple:
    """What a spec's Triton IR depends on: the kernel, its pointer types and its constexprs
    (warps, stages and a register cap enter only at the GPU passes after it)."""
    return id(_jit_fn(fn)), tuple(sorted(ptr.items())), tuple(sorted((k, repr(v)) for k, v in const.items()))


def run(names=None, mode: str = "compile", targets=("sm_90a",), jobs: int = 1, out=print,
        except_shipped: bool = False) -> int:
    """Lower (``mode="frontend"``: every forcible config and flag, Triton IR) or compile
    (``"compile"``: every shipped config, a cubin) the specs of ``names`` (default: every kernel,
    then coverage is checked too) for each of ``targets``; one line per item, then
    ``"<n> failed"``. Returns the number of failures. The frontend lowers each distinct Triton IR
    once (configs that differ only in warps or stages share it); ``except_shipped`` leaves out
    what the compile mode builds (its cubins go through the same frontend: the test suite runs
    both)."""
    every = names is None or list(names) == list(SPECS)
    names = list(SPECS) if names is None else list(names)
    specs = shipped_specs() if mode == "compile" and every else [
        s for name in names for s in SPECS[name](full=mode == "frontend")]
    work = specs
    if mode == "frontend":
        seen = {_ir_key(*s[1:4]) for s in shipped_specs()} if except_shipped else set()
        work = []
        for s in specs:
            key = _ir_key(*s[1:4])
            if key not in seen:
                seen.add(key)
                work.append(s)
    # a cubin for a target where no call launches the kernel checks nothing a user runs
    why = {t: held_back(t) if mode == "compile" else "" for t in targets}
    held: dict = {}
    _WORK[:] = []
    for label, fn, ptr, const, cfg in work:
        pkg = package(fn)
        for tname in targets:
            if why[tname] and pkg in DOT_PACKAGES:
                held[tname, pkg] = held.get((tname, pkg), 0) + 1
                continue
            _WORK.append((label, tname, (fn, ptr, const, cfg.num_warps, cfg.num_stages, getattr(cfg, "maxnreg", None)),
                          mode))
    for (tname, pkg), n in held.items():
        out(f"skip   {tname} {pkg}: {n} configs not compiled: {why[tname]}")
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            lines = [out(line) or line for line in pool.imap(_check, range(len(_WORK)))]
    else:
        lines = [out(line) or line for line in map(_check, range(len(_WORK)))]
    failed = sum(not line.startswith("ok ") for line in lines)
    if every:  # every spec generator ran: the package's kernels must all be in them
        for line in uncovered(specs):
            failed += 1
            out(f"UNCOVERED {line}")
    out(f"{failed} failed")
    return failed


def main(argv) -> int:
    """``[NAME...|all] (--frontend|--compile) [--target sm_90a|sm_100a|sm_90a,sm_100a|all] [--jobs N]``:
    ``run`` on the command line (``python -m kernel_fun.bench.lowering``); exit 1 on a failure."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m kernel_fun.bench.lowering")
    p.add_argument("names", nargs="*", default=["all"], help=f"all, or some of: {', '.join(SPECS)}")
    p.add_argument("--frontend", action="store_true", help="every forcible config and flag, to Triton IR")
    p.add_argument("--compile", action="store_true", help="every shipped config, to a cubin (default)")
    p.add_argument("--except-shipped", action="store_true",
                   help="with --frontend: leave out what --compile builds (lowered there on the way)")
    p.add_argument("--target", default="sm_90a")
    p.add_argument("--jobs", type=int, default=1)
    a = p.parse_args(argv)
    targets = list(TARGETS) if a.target == "all" else a.target.split(",")
    bad = [t for t in targets if t not in TARGETS] + [n for n in a.names if n != "all" and n not in SPECS]
    if bad:
        p.error(f"unknown {', '.join(bad)}; targets: {', '.join(TARGETS)}, all; kernels: {', '.join(SPECS)}")
    names = None if a.names == ["all"] else a.names
    return 1 if run(names, "frontend" if a.frontend else "compile", targets, a.jobs,
                    out=lambda line: print(line, flush=True), except_shipped=a.except_shipped) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
