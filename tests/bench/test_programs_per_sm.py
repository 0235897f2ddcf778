"""``lowering.programs_per_sm``: the occupancy the compile stats report (tools/sass_stats.py), from
registers, shared memory and warps, against cases worked by hand from the CUDA guide's limits."""
import pytest

from kernel_fun.bench.lowering import programs_per_sm


@pytest.mark.parametrize("regs,shared,warps,expect", [
    (255, 131584, 4, 1),   # the backward scan's BV64-w4-s2: 132 KB, over the 115.7 KB two need
    (255, 98816, 4, 2),    # the same with k loaded once a chunk: 99 KB
    (255, 115204, 4, 2),   # the forward scan's VK-BV64-w4-s2: just under 115.7 KB
    (255, 115713, 4, 1),   # one byte over
    (168, 37124, 4, 3),    # 168 registers: 5376 a warp, three four-warp programs in 64 K
    (170, 0, 4, 2),        # 170 rounds up to 5632 a warp: two
    (255, 0, 8, 1),        # eight warps at 255: 65536 registers, one program
    (32, 0, 4, 16),        # few registers: the 64-warp bound
    (16, 0, 1, 32),        # one warp each: the 32-program bound
])
def test_programs_per_sm(regs, shared, warps, expect):
    assert programs_per_sm(regs, shared, warps) == expect
