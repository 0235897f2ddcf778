"""The interpreter shim: a runtime-bound loop runs through Triton's interpreter."""
import os

import pytest
import torch

from kernel_fun._common import tuning

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")


def test_runtime_bound_loop_under_interpreter():
    import triton
    import triton.language as tl

    tuning.install_interpreter_shims()

    @triton.jit
    def _sum_rows(x, out, n_rows, N: tl.constexpr):
        acc = tl.zeros([N], dtype=tl.float32)
        for i in range(n_rows):  # runtime bound: the case NumPy 2.4 broke
            acc += tl.load(x + i * N + tl.arange(0, N))
        tl.store(out + tl.arange(0, N), acc)

    x = torch.randn(5, 8)
    out = torch.empty(8)
    _sum_rows[(1,)](x, out, 5, N=8)
    torch.testing.assert_close(out, x.sum(0))


def test_shim_is_idempotent():
    from triton.runtime import interpreter as interp

    tuning.install_interpreter_shims()
    patched = interp._patch_lang_tensor
    tuning.install_interpreter_shims()
    assert interp._patch_lang_tensor is patched


def test_autotune_configs_first_only_under_interpreter():
    assert tuning.autotune_configs([1, 2, 3]) == [1]


def test_autotune_results_kept_on_disk_where_triton_can():
    """Every autotuned kernel of the package asks Triton to keep its results on disk (a
    restarted job does not re-time every configuration), as fla does for its own."""
    import inspect
    import pathlib

    import triton

    assert ("cache_results" in inspect.signature(triton.autotune).parameters) == bool(tuning.autotune_cache())
    src = pathlib.Path(tuning.__file__).parents[1]
    for path in src.rglob("*.py"):
        text = path.read_text()
        for call in text.split("triton.autotune(")[1:]:
            assert "autotune_cache()" in call.split(")(")[0].split("@triton.jit")[0], path


def test_host_cdiv_and_next_pow2_equal_tritons():
    import triton

    from kernel_fun._common.tuning import cdiv, next_pow2

    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(-3, 5000))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))
    assert cdiv(2**40 + 1, 64) == triton.cdiv(2**40 + 1, 64)


def test_row_stride():
    """The row stride of an output a launcher writes into: a contiguous tensor, a column slice
    of one (the fused q/k/v gradient's parts), size-1 batch or time; not rows unevenly spaced or
    inner dimensions strided."""
    import pytest
    import torch

    from kernel_fun._common.tuning import row_stride

    assert row_stride(torch.empty(2, 5, 3, 4), "x") == 12
    base = torch.empty(2, 5, 40)
    assert row_stride(base[..., 8:20].unflatten(-1, (3, 4)), "x") == 40
    assert row_stride(base[:1, :, 8:20].unflatten(-1, (3, 4)), "x") == 40
    assert row_stride(base[:, :1, 8:20].unflatten(-1, (3, 4)), "x") == 200
    with pytest.raises(ValueError, match="not contiguous"):
        row_stride(torch.empty(2, 5, 4, 3).transpose(2, 3), "x")
    with pytest.raises(ValueError, match="evenly spaced"):
        row_stride(torch.empty(2, 6, 12)[:, :5].unflatten(-1, (3, 4)), "x")
