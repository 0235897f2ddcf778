"""Two GPUs, NCCL: the patched model stack under DDP and FSDP2 at a small shape, through
``tools/multi_gpu_model.py`` (the full-shape run is that tool's default): ours engaged on every
rank in both modes, and ours' step-0 gradients and losses within the bf16 noise floor of fla's
(the single-GPU A/B's rule: ours' difference from fla no larger than fla_ulp's).

The CPU half (gloo, one step, interpreted kernels) is tests/patch/test_ddp_cpu.py.
"""
import json
import math
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]
TOOLS = Path(__file__).parents[2] / "tools"


@pytest.mark.parametrize("layer", ["kda", "gdn"])
def test_ddp_and_fsdp2_of_the_patched_stack(layer, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))  # the spawned ranks import the tool by name
    import multi_gpu_model

    out = tmp_path / "rec.json"
    rc = multi_gpu_model.main(["--layer", layer, "--steps", "6", "--json", str(out), "--timeout", "900",
                               "--shape", "layers=2", "--shape", "hidden=1024", "--shape", "heads=8",
                               "--shape", "T=1024", "--shape", "B=2", "--shape", "warmup=2"])
    assert rc == 0 and out.exists()
    rec = json.loads(out.read_text())["multi_gpu"]
    assert set(rec["modes"]) == {"ddp", "fsdp"}
    for mode, r in rec["modes"].items():
        s, arms = r["summary"], r["arms"]
        assert s["engaged"], (mode, arms["ours"]["engaged_every_rank"])
        assert all(math.isfinite(x) for a in arms.values() for x in a["loss"]), mode
        assert s["within_noise_floor"], (mode, s["grad_diff_over_noise_floor"])
        assert s["max_loss_diff"]["ours"] <= s["max_loss_diff"]["fla_ulp"], (mode, s["max_loss_diff"])
    sys.modules.pop("multi_gpu_model", None)
