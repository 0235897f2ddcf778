"""Every kernel through Triton's compiler on a machine without a GPU, for sm_90a and sm_100a
(``kernel_fun.bench.lowering``, behind ``kernel-fun check --lower``), under whichever Triton is
installed.

The CPU tier runs kernels through Triton's interpreter, which skips the frontend's checks: an
if/else whose branches give one name two shapes passed every interpreted test of a kernel and
failed to compile on the H200 (2026-11-30). These run in a subprocess without
TRITON_INTERPRET (kernels must be real ``triton.jit`` functions to be lowered).

Two depths: every configuration and flag combination through the frontend to Triton IR (the
target-independent step where that if/else fails; sm_90a), and every shipped configuration
(what each autotuner sees, or a launcher's fixed one) all the way to a cubin for each target:
Triton's GPU passes, LLVM and the ptxas its wheel ships. Both also check coverage: a kernel
the package ships (``lowering.discover``: the ``*_kernel`` objects of the
``kernel_fun.<pkg>._kernels`` modules), or a config of its autotuner, that lowering has no
spec for fails the test."""
import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str, run) -> subprocess.CompletedProcess:
    """``code`` (with ``sys`` imported) through the ``run_uninterpreted`` fixture."""
    return run("import sys\n" + code, "frontend_check.py")


def _ptxas_for(target: str) -> str | None:
    """Why this Triton cannot assemble for ``target`` here (None: it can)."""
    from kernel_fun.bench.lowering import ptxas_missing

    return ptxas_missing(target)


def test_every_kernel_lowers_through_the_frontend(run_uninterpreted):
    # what the compile test below builds for sm_90a went through this frontend there
    r = _run("from kernel_fun.bench import lowering\n"
             "sys.exit(lowering.main(['all', '--frontend', '--except-shipped', '--jobs', '2']))\n", run_uninterpreted)
    assert r.returncode == 0 and "\n0 failed" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
    assert "UNCOVERED" not in r.stdout, r.stdout[-4000:]
    assert r.stdout.count("\nok ") >= 100, r.stdout[-2000:]


def test_the_frontend_lowers_each_distinct_ir_once(run_uninterpreted):
    """Configs that differ only in warps or stages give one Triton IR: lowered once. Those
    ``--except-shipped`` leaves out are exactly the compile mode's."""
    r = _run(textwrap.dedent("""
        from kernel_fun.bench import lowering as L

        full = [s for n in L.SPECS for s in L.SPECS[n](full=True)]
        every = {L._ir_key(*s[1:4]) for s in full}
        shipped = {L._ir_key(*s[1:4]) for s in L.shipped_specs()}
        L._check = lambda i: "ok     " + L._WORK[i][0]   # the work list, not the lowering
        for except_shipped in (False, True):
            lines = []
            L.run(mode="frontend", out=lines.append, except_shipped=except_shipped)
            keys = [L._ir_key(*args[:3]) for _, _, args, _ in L._WORK]   # (fn, ptr, const, ...)
            assert len(keys) == len(set(keys)), "an IR lowered twice"
            assert set(keys) == every - (shipped if except_shipped else set()), except_shipped
            assert lines[-1] == "0 failed", lines[-3:]
        assert shipped < every and len(every) < len(full)
        print("distinct", len(full), len(every), len(every - shipped))
    """), run_uninterpreted)
    assert r.returncode == 0 and "distinct" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_every_shipped_config_compiles(run_uninterpreted, target):
    why = _ptxas_for(target)
    if why:
        pytest.skip(why)
    # what a user runs: the CLI, which re-runs itself without TRITON_INTERPRET where it is set
    r = subprocess.run([sys.executable, "-m", "kernel_fun", "check", "--lower", target, "--jobs", "2"],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0 and "\n0 failed" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
    assert "UNCOVERED" not in r.stdout, r.stdout[-4000:]
    ok = [line for line in r.stdout.splitlines() if line.startswith("ok ")]
    assert ok and all(f" {target} " in line for line in ok), r.stdout[-2000:]
    # every family's kernels among them (discover() found them; coverage held each to a spec), but
    # those no call launches on the target: one skip line for each of their packages, with the reason
    from kernel_fun.bench.lowering import held_back

    held = held_back(target)
    skips = [line.split() for line in r.stdout.splitlines() if line.startswith("skip ")]
    assert [s[2] for s in skips] == ([f"{p}:" for p in ("kda", "_delta", "gdn")] if held else []), r.stdout[-2000:]
    assert all(s[1] == target and int(s[3]) > 0 and " ".join(s[7:]) == held for s in skips), skips
    first = {line.split()[2] for line in ok}   # a spec's label starts with its kernel's name
    assert {"cconv", "gnorm"} <= first, sorted(first)
    dot = {"intra_bwd", "wy_bwd", "gate_bwd", "state_scan_fwd", "state_scan_bwd", "score_grad", "gdn_scores",
           "gdn_wy_dv", "gdn_wy_dqk", "gdn_wy_inverse", "gdn_output", "gdn_inputs"}
    assert first & dot == (set() if held else dot), sorted(first)


def test_kernels_held_back_on_a_target_are_those_of_the_families_routed_there():
    """Blackwell below Triton 3.8 routes kda and gdn to fla (``hardware.dot_gate``): ``check --lower
    sm_100a`` leaves their kernels and the engine's out there, and compiles them from 3.8 and on sm_90a."""
    from kernel_fun._common.hardware import DOT_FAMILIES, dot_reason
    from kernel_fun.bench.lowering import DOT_PACKAGES, held_back

    assert set(DOT_PACKAGES) == set(DOT_FAMILIES) | {"_delta"}
    for version in ((3, 6, 0), (3, 7, 1)):
        assert held_back("sm_100a", version) == dot_reason((10, 0), version) != ""
        assert "Triton 3.8" in held_back("sm_100a", version)
        assert held_back("sm_90a", version) == ""
    for version in ((3, 8, 0), (3, 9, 0)):
        assert held_back("sm_100a", version) == held_back("sm_90a", version) == ""


def test_the_check_catches_what_the_interpreter_misses(run_uninterpreted):
    """A kernel the interpreter runs, with one name bound to two shapes across an if/else."""
    r = _run(textwrap.dedent("""
        import triton, triton.language as tl
        from kernel_fun.bench import lowering

        @triton.jit
        def two_shapes(x, n, A: tl.constexpr, B: tl.constexpr):
            if tl.program_id(0) < n:
                o = tl.arange(0, A)
            else:
                o = tl.arange(0, B)
            tl.store(x + o, 1.0)

        lowering.lower(two_shapes, {"n": "i32"}, dict(A=16, B=16), num_warps=4)   # same shape: fine
        try:
            lowering.lower(two_shapes, {"n": "i32"}, dict(A=16, B=32), num_warps=4)
        except Exception as e:
            print("rejected:", type(e).__name__)
    """), run_uninterpreted)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rejected: CompilationError" in r.stdout, r.stdout + r.stderr[-3000:]


# `_common.fastmath.sigmoid`'s GPU form (inline PTX) cannot run under the interpreter, which
# executes its `tl.sigmoid` form: assembled here for each target with the ptxas that ships with
# Triton and held to what it is for (the PTX carries the approximate instructions, the SASS is
# shorter than tl.sigmoid's). Its values are checked on the GPU (tests/cconv, every dtype).
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_fast_sigmoid_assembles_and_is_shorter(run_uninterpreted, target):
    why = _ptxas_for(target)
    if why:
        pytest.skip(why)
    r = _run(textwrap.dedent("""
        import os, re, subprocess, tempfile
        import triton, triton.language as tl
        from kernel_fun.bench import lowering
        from kernel_fun._common.fastmath import sigmoid

        @triton.jit
        def k(x, y, FAST: tl.constexpr):
            o = tl.arange(0, 128)
            tl.store(y + o, sigmoid(tl.load(x + o), FAST))

        for fast in (True, False):
            src = lowering.source(k, {"x": "*fp32", "y": "*fp32"}, dict(FAST=fast))
            c = triton.compile(src, target=lowering.TARGETS[TARGET_NAME], options=dict(num_warps=1))
            f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False)
            f.write(c.asm["cubin"]); f.close()
            sass = subprocess.run([os.path.join(lowering.TOOLS, "cuobjdump"), "-sass", f.name],
                                  capture_output=True, text=True).stdout
            body = [l for l in sass.splitlines() if re.match(r"\\s+/\\*[0-9a-f]{4,6}\\*/", l)]
            print("fast" if fast else "exact", "ftz" if "ex2.approx.ftz.f32" in c.asm["ptx"] else "-",
                  "rcp" if "rcp.approx.ftz.f32" in c.asm["ptx"] else "-", len(body))
    """).replace("TARGET_NAME", repr(target)), run_uninterpreted)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    fast, exact = lines["fast"].split(), lines["exact"].split()
    assert fast[:2] == ["ftz", "rcp"], lines
    assert int(fast[2]) < int(exact[2]), lines
