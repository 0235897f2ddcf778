"""`kernel-fun check` for kda (and gdn, the other front-end of the delta engine): our stage
kernels against their references (interpreted on CPU), every declared kernel launched."""
import re

import pytest

from kernel_fun.bench import harness
from kernel_fun.bench.kda import check


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_interpreted_check_passes_and_launches_every_declared_kernel(capsys, device, family):
    mod = __import__(f"kernel_fun.bench.{family}", fromlist=["check"])
    assert harness.check_family(family, mod, device) == []
    out = capsys.readouterr().out
    for name in mod.KERNELS:
        assert re.search(rf"^check {re.escape(name)} +ok +[1-9]\d* launches", out, re.M), (name, out)
    assert f"check {family}: ok" in out


def test_check_catches_a_wrong_stage(monkeypatch, device):
    from kernel_fun.kda import chain

    real = chain.intra_bwd

    def wrong(**kw):
        dq, dk, db, dg = real(**kw)
        return dq, dk * 1.01, db, dg

    monkeypatch.setattr(chain, "intra_bwd", wrong)
    failures = check(device)
    assert len(failures) == 1 and "intra_bwd: dk relative error" in failures[0]


def test_check_catches_wrong_scan_score_and_gate_stages(monkeypatch, device):
    """One output of each of the score gradient, the backward scan and the gate pass off by 1%:
    one failure each, naming the stage and the output (so check_family files it under its kernel)."""
    from kernel_fun.kda import chain

    real_sg, real_bwd, real_gate = chain.score_grad_bwd, chain.state_scan_bwd, chain.dg_cumsum_gate_bwd

    def sg(*a, **kw):
        return real_sg(*a, **kw) * 1.01

    def bwd(**kw):
        dh, dh0, dv = real_bwd(**kw)
        return dh, dh0, dv * 1.01

    def gate(*a, **kw):
        dg, dA_log, ddt_bias = real_gate(*a, **kw)
        return dg, dA_log * 1.01, ddt_bias

    monkeypatch.setattr(chain, "score_grad_bwd", sg)
    monkeypatch.setattr(chain, "state_scan_bwd", bwd)
    monkeypatch.setattr(chain, "dg_cumsum_gate_bwd", gate)
    failures = check(device)
    assert len(failures) == 3, failures
    assert "kda score_grad: dAqk relative error" in failures[0]
    assert "kda state_scan_bwd: dv relative error" in failures[1]
    assert "kda gate_bwd: dA_log relative error" in failures[2]


def test_check_runs_the_stages_as_the_chain_does(monkeypatch, device):
    """The check calls our intra stage with the one anchor's fast range, and the forward scan
    with the gated queries, as the chain does."""
    from kernel_fun.kda import chain

    real_intra, real_fwd, seen = chain.intra_bwd, chain.state_scan_fwd, []

    def spy_intra(**kw):
        seen.append(("fast_range", kw.get("fast_range")))
        return real_intra(**kw)

    def spy_fwd(*a, **kw):
        seen.append(("q_gated", kw.get("q_gated")))
        return real_fwd(*a, **kw)

    monkeypatch.setattr(chain, "intra_bwd", spy_intra)
    monkeypatch.setattr(chain, "state_scan_fwd", spy_fwd)
    assert check(device) == []
    assert seen == [("fast_range", chain.INTRA_BWD_FAST_RANGE), ("q_gated", True)]
