"""`kernel-fun bench --stages FAMILY` end to end at its small shapes: every configuration of a
kernel forced, each row checked against the reference (and a wrong reference flagged), the
record written; and every family's probes cover every shipped kernel."""
import importlib
import json

import pytest

from kernel_fun import __main__ as cli
from kernel_fun.bench import stages

# small enough for the interpreter, and on a GPU too (several channel blocks, a ragged T; fp32,
# whose 1e-5 tolerance a 1% error cannot pass)
SMALL = "B=2,T=37,D=192,dtype=float32"


def _stages(tmp_path, device, *extra):
    path = tmp_path / "stages.json"
    argv = ["bench", "--stages", "cconv", "--device", device, "--kernel", "cconv.fwd", "--shape", SMALL,
            "--json", str(path), *extra]
    return cli.main(argv), json.loads(path.read_text())


def test_stages_forces_every_config_and_checks_each(tmp_path, device):
    from kernel_fun.cconv._kernels import fwd

    status, rec = _stages(tmp_path, device)
    assert status == 0
    rows = rec["rows"]
    names = [fwd.config_name(c) for c in fwd.CONFIGS + fwd.CANDIDATES]
    assert [r["config"] for r in rows] == names + ["autotuned"]
    assert [r["kind"] for r in rows] == ["shipped"] * len(fwd.CONFIGS) + ["candidate"] * len(fwd.CANDIDATES) + [
        "autotuned"]
    assert all(r["kernel"] == "cconv.fwd" and r["ok"] and r["max_rel_err"] < 1e-5 for r in rows), rows
    assert all((r["ms"] is None) == (device == "cpu") for r in rows), rows
    assert rec["stages"] == "cconv" and rec["shape"]["D"] == 192 and rec["git_sha"] and rec["versions"]["triton"]


def test_stages_config_picks_rows_by_name_or_kind(tmp_path, device):
    """``--config``: a kind (here the candidates) and a name (the first shipped one) pick exactly
    those rows; a name no probe has gives no rows, which fails the run."""
    from kernel_fun.cconv._kernels import fwd

    first = fwd.config_name(fwd.CONFIGS[0])
    status, rec = _stages(tmp_path, device, "--config", "candidate", "--config", first)
    assert status == 0
    want = [first] + [fwd.config_name(c) for c in fwd.CANDIDATES]
    assert [r["config"] for r in rec["rows"]] == want and rec["configs"] == sorted(["candidate", first])
    status, rec = _stages(tmp_path, device, "--config", "no-such-config")
    assert status == 1 and rec["rows"] == []


def test_stages_flags_outputs_that_miss_the_reference(tmp_path, device, monkeypatch):
    """The reference off by 1%: every row is checked, so every row fails, and the run exits 1."""
    from kernel_fun.cconv import reference

    real = reference.conv_ref
    monkeypatch.setattr(reference, "conv_ref", lambda *a, **kw: real(*a, **kw) * 1.01)
    status, rec = _stages(tmp_path, device)
    assert status == 1
    assert rec["rows"] and not any(r["ok"] for r in rec["rows"])
    assert all(0.005 < r["max_rel_err"] < 0.02 for r in rec["rows"]), rec["rows"]


@pytest.mark.parametrize("family", stages.FAMILIES)
def test_every_shipped_kernel_has_a_stage_probe(family, device):
    """A kernel in a family's KERNELS is a probe's (or runs inside one, STAGED_WITH), and each
    probe's config lists are its module's CONFIGS and CANDIDATES."""
    mod = importlib.import_module(f"kernel_fun.bench.{family}")
    probes = mod.probes(device, mod.STAGE_SHAPES["cpu"])
    staged = {p.kernel for p in probes}
    inside = getattr(mod, "STAGED_WITH", {})
    assert staged | set(inside) == set(mod.KERNELS) and set(inside.values()) <= staged
    for p in probes:
        lists = [c for c, _ in p.configs()]
        assert lists == getattr(p.module, p.lists + "CONFIGS") + getattr(p.module, p.lists + "CANDIDATES")
        assert len({p.config_name(c) for c in lists}) == len(lists)  # names tell configs apart


def test_cconv_stages_read_a_column_slice(tmp_path, device):
    """layout=column_slice: the backward's probe reads x as the middle third of a [B, T, 3D]
    projection (row stride 3D), as the layers' fused q/k/v conv hands it over, and checks it."""
    path = tmp_path / "stages.json"
    status = cli.main(["bench", "--stages", "cconv", "--device", device, "--kernel", "cconv.bwd", "--shape",
                       SMALL + ",layout=column_slice", "--json", str(path)])
    rec = json.loads(path.read_text())
    assert status == 0 and rec["shape"]["layout"] == "column_slice"
    assert rec["rows"] and all(r["kernel"] == "cconv.bwd" and r["ok"] for r in rec["rows"]), rec["rows"]
    from kernel_fun.bench import cconv
    from kernel_fun.bench.harness import UsageError

    with pytest.raises(UsageError, match="layout='diagonal'"):
        cconv.probes(device, dict(layout="diagonal"))


def test_gdn_stages_with_packed_documents(tmp_path, device):
    """docs=N: every gdn stage kernel forced with `cu_seqlens` (N documents of random lengths in
    B=1's T tokens) and checked against its varlen fp64 reference; the state rows per document.
    A reference without the documents would fail most rows (checked by hand, 2026-12-02: 47 of 63)."""
    path = tmp_path / "stages.json"
    status = cli.main(["bench", "--stages", "gdn", "--device", device, "--shape", "T=150,docs=3",
                       "--config", "shipped", "--json", str(path)])
    rec = json.loads(path.read_text())
    assert status == 0 and rec["shape"]["docs"] == 3
    kernels = {r["kernel"] for r in rec["rows"]}
    assert kernels == {"gdn.wy_inverse", "delta.state_scan_fwd", "delta.state_scan_bwd", "gdn.gated_scores", "gdn.wy_dv_bwd",
                       "gdn.wy_dqk_bwd", "gdn.inputs_fwd", "gdn.inputs_bwd", "gdn.chunk_output"}, kernels
    assert all(r["ok"] for r in rec["rows"]), [r for r in rec["rows"] if not r["ok"]]
    from kernel_fun.bench import gdn
    from kernel_fun.bench.harness import UsageError

    with pytest.raises(UsageError, match="docs=2 packs one sequence"):
        gdn.probes(device, dict(B=2, docs=2))
