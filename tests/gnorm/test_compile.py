"""gnorm's kernels through Triton's compiler for sm_90a on a machine without a GPU (with
``kernel_fun.bench.lowering``'s helpers): every config and flag combination lowers through the frontend
(which the interpreter skips), and the backward's configs compile without spills at the layers'
widths under their register caps (a spill would cost the bandwidth the caps are for).

Run in a subprocess without TRITON_INTERPRET (kernels must be real ``triton.jit`` functions).
"""
import subprocess
import textwrap

_SPECS = textwrap.dedent("""
    import itertools, sys
    from kernel_fun.bench import lowering
    from kernel_fun.gnorm._kernels import bwd, dw_reduce, fwd
    from kernel_fun.gnorm._kernels.common import rows_per_tile

    FWD_PTR = dict(x="*bf16", g="*bf16", y="*bf16", res="*bf16", res_out="*fp32", w="*fp32", N="i32",
                   eps="fp32", s_x="i32:16", s_g="i32:16", s_r="i32:16")
    BWD_PTR = dict(h="*bf16", g="*bf16", dy="*bf16", dx="*bf16", dg="*bf16", dres="*bf16", dres_in="*fp32",
                   w="*fp32", flag="*i32", N="i32", s_h="i32:16", s_g="i32:16", s_dy="i32:16", s_dres="i32:16")

    def fwd_specs(widths, flags, first=False):
        cfgs = (fwd.CONFIGS + fwd.CANDIDATES)[:1 if first else None]
        for V, cfg, gate, f in itertools.product(widths, cfgs, (0, 1), flags):
            BV = 1 << (V - 1).bit_length()
            c = dict(V=V, BV=BV, GATE=gate, HAS_W=f[0], HAS_B=f[1], HAS_RES=f[2], STORE_RES=f[3], N_BUCKET=2,
                     TILE=cfg.kwargs["TILE"], BR=rows_per_tile(cfg.kwargs["TILE"], BV), FAST=True)
            yield f"fwd V={V} gate={gate} flags={f} {lowering.cfg_label(cfg)}", fwd.gnorm_fwd_kernel.fn.fn, FWD_PTR, c, cfg

    def bwd_specs(widths, flags, first=False):
        cfgs = (bwd.CONFIGS + bwd.CANDIDATES)[:1 if first else None]
        for V, cfg, gate, f in itertools.product(widths, cfgs, (0, 1), flags):
            BV = 1 << (V - 1).bit_length()
            c = dict(V=V, BV=BV, GATE=gate, HAS_W=f[0], HAS_B=f[1], HAS_DRES=f[2], STORE_DRES=f[3], N_BUCKET=2,
                     TILE=cfg.kwargs["TILE"], PPS=cfg.kwargs["PPS"], NS=cfg.kwargs["NS"],
                     SLOTS=bwd.slots_of(cfg), TAIL_FIRST=cfg.kwargs.get("TAIL_FIRST", True),
                     BR=rows_per_tile(cfg.kwargs["TILE"], BV), FAST=True)
            yield f"bwd V={V} gate={gate} flags={f} {lowering.cfg_label(cfg)}", bwd.gnorm_bwd_kernel.fn.fn, BWD_PTR, c, cfg
""")


def _run(body: str, run) -> subprocess.CompletedProcess:
    """``body`` after the spec helpers, through the ``run_uninterpreted`` fixture."""
    return run(_SPECS + textwrap.dedent(body), "gnorm_compile.py")


def test_every_config_and_flag_combination_lowers(run_uninterpreted):
    r = _run("""
        # every flag combination at one config, every config at the layers' flags (the code
        # paths are the flags'; a config changes only the tile's shape), at a masked width
        flags = list(itertools.product((False, True), repeat=4))
        one = [(True, False, False, False)]
        n = bad = 0
        every_flag = list(fwd_specs((96,), flags, first=True)) + list(bwd_specs((96,), flags, first=True))
        every_cfg = list(fwd_specs((96,), one)) + list(bwd_specs((96,), one))
        for specs in (every_flag, every_cfg):
            for label, fn, ptr, c, cfg in specs:
                n += 1
                try:
                    lowering.lower(fn, ptr, c, cfg.num_warps, 1, cfg.maxnreg)
                except Exception as e:
                    bad += 1
                    print("FAILED", label, type(e).__name__, str(e)[:300])
        for hw, hb in ((True, False), (False, True), (True, True)):
            lowering.lower(dw_reduce.dw_reduce_kernel, dict(n_part="i32", V="i32"),
                             dict(HAS_W=hw, HAS_B=hb, BP=32, BM=128), 4)
        print(n, "lowered", bad, "failed")
    """, run_uninterpreted)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " 0 failed" in r.stdout, r.stdout[-3000:]


def test_backward_configs_do_not_spill_at_the_layer_widths(run_uninterpreted):
    # the layers' calls: weight, no bias, no prenorm gradient (V = 128, 256, 512); both gates at the
    # widest, where a spill would come first, one at each of the others (as `check --lower`)
    r = _run("""
        for label, fn, ptr, c, cfg in bwd_specs((128, 256, 512), [(True, False, False, False)]):
            if (c["V"], c["GATE"]) in ((128, 1), (256, 0)):
                continue
            # as launched (the loop's stages are NS, a constexpr): at V = 128 and 256 the same compile
            # as `check --lower sm_90a`'s, which Triton's cache then serves; a spill shows as stack
            # (ptxas spills to it), read without disassembling
            s = lowering.stats(fn, ptr, c, cfg.num_warps, cfg.num_stages, cfg.maxnreg, sass=False)
            print(label, s["regs"], s["stack_bytes"], s["shared_bytes"])
    """, run_uninterpreted)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [line.rsplit(" ", 3) for line in r.stdout.strip().splitlines()]
    assert rows, r.stdout
    spills = [line for line, regs, stack, smem in rows if int(stack) > 0]
    assert not spills, "\n".join(spills)


def test_row_loads_and_stores_are_16_byte_vectors(run_uninterpreted):
    # bf16 rows at the layers' widths: every element access a 128-bit ld/st.global.v4 (the 32-bit
    # ones left are rstd and the weight); 2048-element tiles on 4 warps give each thread 16
    # elements per tensor = 2 vectors
    r = _run("""
        import re, triton
        for label, fn, ptr, c, cfg in list(fwd_specs((128, 256), [(True, False, False, False)]))[:1] + \\
                list(fwd_specs((256,), [(True, False, False, False)]))[:1] + \\
                [s for s in bwd_specs((128, 256), [(True, False, False, False)]) if "'NS': 1}" in s[0] and "'TILE': 2048" in s[0]]:
            # as launched (the config's stages): where `check --lower sm_90a` built the same, a cache hit
            k = triton.compile(lowering.source(fn, ptr, c), target=lowering.TARGET,
                               options=lowering.options(cfg.num_warps, cfg.num_stages, cfg.maxnreg))
            ptx = k.asm["ptx"]
            print(label.split()[0], len(re.findall(r"ld\\.global(?:\\.[a-z]+)*\\.v4\\.b32", ptx)),
                  len(re.findall(r"st\\.global(?:\\.[a-z]+)*\\.v4\\.b32", ptx)), len(re.findall(r"st\\.global(?:\\.[a-z]+)*\\.b16", ptx)))
    """, run_uninterpreted)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [line.split() for line in r.stdout.strip().splitlines()]
    assert [x[0] for x in rows].count("fwd") == 2 and [x[0] for x in rows].count("bwd") == 4, rows
    for kind, ld, st, st16 in rows:
        # fwd: x, g in, y out; bwd: h, g, dy in, dx, dg out; 2 vectors each; no scalar bf16 store
        assert (int(ld), int(st), int(st16)) == ((4, 2, 0) if kind == "fwd" else (6, 4, 0)), rows
