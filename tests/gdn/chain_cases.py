"""Inputs and the fwd+bwd runner shared by the whole-chain tests (CPU with fla stand-ins, and
GPU): a GDN call like fla's GatedDeltaNet layer's and every gradient it produces, by name."""
from __future__ import annotations

import torch


def make_inputs(B, T, H, HV, K, V, h0=False, N=None, gate_in_kernel=True, beta_logits=True,
                strong_decay=False, state_v_first=True, seed=0, device="cuda", dtype=torch.bfloat16):
    """q, k, v, g, beta (and A_log, dt_bias, initial_state as asked), all requiring grad."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def r(*s, dt=dtype):
        return torch.randn(*s, device=device, generator=gen).to(dt)

    t = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V))
    if gate_in_kernel:
        t["g"] = r(B, T, HV)
        a = 2.0 if strong_decay else 0.0  # exp(A_log) up to ~e^4: per-token log decay down to ~-60
        t["A_log"] = torch.rand(HV, device=device, generator=gen) * 2 + a - 1.0
        t["dt_bias"] = r(HV, dt=torch.float32)
    else:
        t["g"] = torch.nn.functional.logsigmoid(r(B, T, HV, dt=torch.float32) + (0.0 if not strong_decay else -3.0)
                                                ).to(dtype)
    t["beta"] = r(B, T, HV) if beta_logits else torch.rand(B, T, HV, device=device, generator=gen).to(dtype)
    if h0:
        n = N or B
        shape = (n, HV, V, K) if state_v_first else (n, HV, K, V)
        t["initial_state"] = r(*shape, dt=torch.float32)
    for x in t.values():
        x.requires_grad_(True)
    return t


RENAME = dict(q="dq", k="dk", v="dv", g="dg", beta="dbeta", initial_state="dh0", A_log="dA_log",
              dt_bias="ddt_bias")


def run(fn, t, do, dht, **flags):
    """fn (``chunk_gated_delta_rule`` or the reference) forward and backward: {"o", "ht", "dq", ...}."""
    kw = {k: v for k, v in t.items() if k not in ("q", "k", "v", "g", "beta")}
    if "A_log" in t:
        kw["use_gate_in_kernel"] = True
    o, ht = fn(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw, **flags)
    outs = [o] + ([ht] if ht is not None else [])
    grads = [do] + ([dht] if ht is not None else [])
    names = list(t)
    gs = torch.autograd.grad(outs, [t[n] for n in names], grads, allow_unused=True)
    return {"o": o, "ht": ht, **{RENAME[n]: g for n, g in zip(names, gs)}}
