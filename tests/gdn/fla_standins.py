"""Plain-torch stand-ins for the fla stage functions the GDN chain calls (fla's kernels do not
run under Triton's interpreter), so the CPU tier can run the whole chain: fla's stages in
torch, ours through the interpreter, end to end against the fp64 recurrence.

Each stand-in has the signature and return convention of fla 0.6.0's function (shapes, dtypes,
rounding to the dtype fla stores), computed chunk by chunk in fp64. ``install(monkeypatch)``
routes ``gdn.chain``'s fla calls to these and returns the list of (module, symbol) called.
Loaded by ``tests/gdn/conftest.py`` as ``gdn_fla_standins`` (tests/kda has its own module of
this file name).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_fun.gdn.reference_stages import BT, chunks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "delta"))
from input_standins import INPUTS, install_into  # noqa: E402  (shared with the other family)

F64 = torch.float64


def _cumsum(x, cu_seqlens, reverse=False):
    out = torch.zeros_like(x, dtype=F64)
    for b, s, e, _ in chunks(x.shape[0], x.shape[1], cu_seqlens):
        c = x[b, s:e].double()
        out[b, s:e] = c.flip(0).cumsum(0).flip(0) if reverse else c.cumsum(0)
    return out


def _gate(g, A_log, dt_bias):
    x = g.double() + (dt_bias.double().reshape(-1) if dt_bias is not None else 0)
    return -A_log.double().reshape(-1).exp() * F.softplus(x)


def gdn_gate_chunk_cumsum(g, A_log, chunk_size=BT, scale=None, dt_bias=None, cu_seqlens=None, chunk_indices=None,
                          output_dtype=torch.float, **_):
    assert chunk_size == BT
    return (_cumsum(_gate(g, A_log, dt_bias), cu_seqlens) * (scale or 1.0)).to(output_dtype)


def chunk_local_cumsum(g, chunk_size=BT, reverse=False, scale=None, cu_seqlens=None, chunk_indices=None, **_):
    assert chunk_size == BT
    return (_cumsum(g, cu_seqlens, reverse) * (scale or 1.0)).float()


def gdn_gate_bwd(g, A_log, dt_bias, dyg):
    x = g.double() + (dt_bias.double().reshape(-1) if dt_bias is not None else 0)
    gate = -A_log.double().reshape(-1).exp() * F.softplus(x)
    dyg = dyg.double()
    dg = -A_log.double().reshape(-1).exp() * torch.sigmoid(x) * dyg
    dA = (dyg * gate).reshape(-1, g.shape[-1]).sum(0)
    db = dg.reshape(-1, g.shape[-1]).sum(0).to(dt_bias.dtype) if dt_bias is not None else None
    return dg.to(g.dtype), dA.view_as(A_log).to(A_log.dtype), db


STANDINS = {
    **INPUTS,  # _delta/inputs' l2norm and beta sigmoid (tests/delta/input_standins.py)
    ("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum"): gdn_gate_chunk_cumsum,
    ("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd"): gdn_gate_bwd,
    ("fla.ops.utils.cumsum", "chunk_local_cumsum"): chunk_local_cumsum,
}


def install(monkeypatch):
    """Route gdn.chain's fla stage calls (and ``_delta.inputs``') to the stand-ins. Returns the
    list of (module, symbol) called, in order."""
    from kernel_fun.gdn import chain

    return install_into(monkeypatch, chain, STANDINS)
