"""scripts/kda_switch_ab.py's switch sets (device time goes to that script: its logic is
checked here on the CPU against a stand-in chain module)."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kda_switch_ab.py"


def _script():
    spec = importlib.util.spec_from_file_location("kda_switch_ab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _chain():
    return SimpleNamespace(FUSE_L2NORM_BWD=True, FUSE_DG_CUMSUM=False, FUSE_GATE_BWD=False, FUSE_WY_FWD=False,
                           FUSE_WY_INTRA_BWD=False, INTRA_BWD_ONE_ANCHOR=True, FUSE_DV_DHU=True,
                           FUSE_DAQK_WY=False,
                           STAGES={"state_scan_fwd": "scan", "intra_bwd": "ib", "wy_bwd": "wy", "state_scan_bwd": "dhu",
                                   "gate_bwd": "gb"},
                           CANDIDATE_STAGES={"intra_fwd": "if", "fwd_intra": "fi"})


def _shipped(chain):
    return dict(FUSE_L2NORM_BWD=chain.FUSE_L2NORM_BWD, FUSE_DG_CUMSUM=chain.FUSE_DG_CUMSUM,
                FUSE_GATE_BWD=chain.FUSE_GATE_BWD, FUSE_WY_FWD=chain.FUSE_WY_FWD,
                FUSE_WY_INTRA_BWD=chain.FUSE_WY_INTRA_BWD, INTRA_BWD_ONE_ANCHOR=chain.INTRA_BWD_ONE_ANCHOR,
                FUSE_DV_DHU=chain.FUSE_DV_DHU, FUSE_DAQK_WY=chain.FUSE_DAQK_WY, stages=dict(chain.STAGES))


@pytest.mark.parametrize("combo", list(_script().COMBOS))
def test_each_combination_sets_exactly_its_parts(combo):
    ab, chain = _script(), _chain()
    shipped = _shipped(chain)
    assert ab.shipped_setup(chain) == shipped
    parts = ab.COMBOS[combo]
    ab.set_switches(chain, shipped, parts)
    assert chain.FUSE_L2NORM_BWD == ("l2norm" in parts)
    assert chain.FUSE_DG_CUMSUM == ("dg_cumsum" in parts)
    assert chain.FUSE_GATE_BWD == ("gate" in parts)
    assert chain.FUSE_WY_FWD == ("wyf" in parts)
    assert chain.FUSE_WY_INTRA_BWD == ("wyi" in parts)
    assert chain.INTRA_BWD_ONE_ANCHOR == ("ianc" in parts)
    assert chain.FUSE_DV_DHU == ("dvd" in parts)
    assert chain.FUSE_DAQK_WY == ("daqk" in parts)
    assert "dvd" not in parts or "dhu" in parts  # dv in our dhu needs our dhu
    assert "daqk" not in parts or "dvd" in parts
    switchable = set(ab.SWITCHABLE_STAGES.values())
    want = {k: v for k, v in shipped["stages"].items() if k not in switchable}
    want.update({"state_scan_bwd": "dhu"} if "dhu" in parts else {})
    want.update({"intra_fwd": "if"} if "ifwd" in parts else {})
    want.update({"fwd_intra": "fi"} if "fwdi" in parts else {})
    want.update({"gate_bwd": "gb"} if "gbwd" in parts else {})
    assert chain.STAGES == want
    assert set(parts) <= {"l2norm", "dg_cumsum", "gate", "wyf", "wyi", "ianc", "dvd", "daqk"} | set(ab.SWITCHABLE_STAGES), parts
    ab.set_switches(chain, shipped, None)  # back to the chain as it ships
    assert _shipped(chain) == shipped


def test_the_real_chain_has_every_switch_and_stage_the_script_names():
    from kernel_fun.kda import chain

    ab = _script()
    for n in ("FUSE_L2NORM_BWD", "FUSE_DG_CUMSUM", "FUSE_GATE_BWD", "FUSE_WY_FWD", "FUSE_WY_INTRA_BWD",
              "INTRA_BWD_ONE_ANCHOR", "FUSE_DV_DHU", "FUSE_DAQK_WY"):
        assert isinstance(getattr(chain, n), bool), n
    for stage in ab.SWITCHABLE_STAGES.values():
        assert stage in chain.STAGES or stage in chain.CANDIDATE_STAGES, stage
    for n in ab.SWITCHES.values():
        assert isinstance(getattr(chain, n), bool), n
