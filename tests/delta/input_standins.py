"""Plain-torch stand-ins for the fla functions ``_delta/inputs.py`` calls around both delta-rule
chains (the l2norm of q, k and the beta sigmoid, with their backwards), shared by kda's and
gdn's ``fla_standins``, and the installer both use: fla's kernels do not run under Triton's
interpreter. Same signatures and return conventions as fla 0.6.0's, computed in fp64."""
from __future__ import annotations

import torch


def l2norm_fwd(x, eps=1e-6, output_dtype=None):
    x.view(-1, x.shape[-1])  # as fla's l2norm_fwd does: raises on a strided x, as fla would
    xd = x.double()
    rstd = 1.0 / torch.sqrt((xd * xd).sum(-1) + eps)
    return (xd * rstd[..., None]).to(output_dtype or x.dtype), rstd.reshape(-1).float()


def l2norm_bwd(y, rstd, dy, eps=1e-6):
    yd, dyd = y.double(), dy.double()
    r = rstd.double().view(*y.shape[:-1], 1)
    return (dyd * r - (dyd * yd).sum(-1, keepdim=True) * yd * r).to(y.dtype)


def fused_beta_sigmoid_fwd(x, scale=1.0):
    return (scale * torch.sigmoid(x.double())).float()


def fused_beta_sigmoid_bwd(x, dy, scale=1.0):
    s = torch.sigmoid(x.double())
    return (dy.double() * scale * s * (1 - s)).to(x.dtype)


INPUTS = {
    ("fla.modules.norm.l2norm", "l2norm_fwd"): l2norm_fwd,
    ("fla.modules.norm.l2norm", "l2norm_bwd"): l2norm_bwd,
    ("fla.ops.common.gate", "fused_beta_sigmoid_fwd"): fused_beta_sigmoid_fwd,
    ("fla.ops.common.gate", "fused_beta_sigmoid_bwd"): fused_beta_sigmoid_bwd,
}


def install_into(monkeypatch, chain, standins: dict) -> list:
    """Route ``chain``'s and ``_delta.inputs``' fla calls to ``standins`` (fla's index helpers,
    torch code, stay fla's). Returns the list of (module, symbol) called, in order."""
    from kernel_fun._common.compat import fla_symbol
    from kernel_fun._delta import inputs

    called = []

    def fake(module, symbol):
        called.append((module, symbol))
        return standins.get((module, symbol)) or fla_symbol(module, symbol)

    monkeypatch.setattr(chain, "_fla", fake)
    monkeypatch.setattr(inputs, "_fla", fake)  # the l2norm and beta sigmoid around the chain
    return called
