"""What the gnorm stages share: the gate's math, the row-tile sizing, the config pruning."""
from __future__ import annotations

import triton
import triton.language as tl

from kernel_fun._common.fastmath import sigmoid
from kernel_fun._common.tuning import next_pow2

# The gate codes the kernels take (constexpr): fla's 'swish' and 'silu' are one function.
SWISH = 0
SIGMOID = 1
GATES = {"swish": SWISH, "silu": SWISH, "sigmoid": SIGMOID}

# Rows up to this width (elements) fit one program's registers; wider rows route to fla.
MAX_V = 8192


def block_v(V: int) -> int:
    """The padded row width BV: the next power of two (masked past V)."""
    return next_pow2(V)


def rows_per_tile(tile: int, bv: int) -> int:
    """Rows per program tile: `tile` elements of `bv`-wide rows, at least one row."""
    return max(1, tile // bv)


def n_bucket(n: int) -> int:
    """Autotune key for the row count (0: latency-sized, < 16 Ki rows; 1: < 256 Ki; 2: more):
    a few buckets, so a new sequence length does not re-tune."""
    return 0 if n < (1 << 14) else (1 if n < (1 << 18) else 2)


def prune_by_registers(max_per_thread: int):
    """An ``early_config_prune`` keeping configs whose tile gives each thread at most
    `max_per_thread` elements per tensor (wider ones spill); at least the config with the
    most threads survives."""

    def prune(configs, nargs, **kwargs):
        bv = kwargs.get("BV", nargs.get("BV"))

        def per_thread(c):
            return max(c.kwargs["TILE"], bv) // (32 * c.num_warps)

        keep = [c for c in configs if per_thread(c) <= max_per_thread]
        return keep or [max(configs, key=lambda c: c.num_warps)]

    return prune


@triton.jit
def gate_fwd(gv, GATE: tl.constexpr, FAST: tl.constexpr):
    """act(g) in fp32: g * sigmoid(g) (swish/silu) or sigmoid(g)."""
    s = sigmoid(gv, FAST)
    if GATE == 0:
        s = gv * s
    return s


@triton.jit
def gate_fwd_bwd(gv, GATE: tl.constexpr, FAST: tl.constexpr):
    """(act(g), act'(g)) in fp32 from one sigmoid: swish' = s (1 + g (1 - s)), sigmoid' = s (1 - s)."""
    s = sigmoid(gv, FAST)
    if GATE == 0:
        gate = gv * s
        dgate = s + gate * (1.0 - s)
    else:
        gate = s
        dgate = s * (1.0 - s)
    return gate, dgate
