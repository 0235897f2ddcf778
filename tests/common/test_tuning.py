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


def test_work_bucket_steps_of_four_from_two_to_nine():
    units = (0, 1, 15, 16, 63, 64, 255, 256, 1023, 1024, 4095, 4096, 16383, 16384, 65535, 65536, 10**9)
    assert [tuning.work_bucket(u) for u in units] == [2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    # fla's GatedDeltaNet layer in the model A/B (B=4, T=4096, 32 value heads): its scans and its
    # chunk kernels; B=1 T=4096 H=HV=16 (the latency case); a CPU test's shapes
    assert tuning.work_bucket(4 * 32) == 4 and tuning.work_bucket(4 * 64 * 32) == 7
    assert tuning.work_bucket(1 * 16) == 3 and tuning.work_bucket(1 * 64 * 16) == 6
    assert tuning.work_bucket(2 * 2 * 2) == 2
    # a chunk kernel's: its chunks from B and T (a partial last chunk counts), times its heads
    assert tuning.chunk_work(4, 4096, 64, 32) == 7 and tuning.chunk_work(1, 4096, 64, 16) == 6
    assert tuning.chunk_work(1, 4032, 64, 16) == 5 and tuning.chunk_work(1, 4033, 64, 16) == 6  # 63, 64 chunks


def _delta_rule_kernel_modules():
    import importlib
    import pkgutil

    for pkg in ("kernel_fun._delta._kernels", "kernel_fun.gdn._kernels", "kernel_fun.kda._kernels"):
        p = importlib.import_module(pkg)
        for info in pkgutil.iter_modules(p.__path__):
            yield importlib.import_module(f"{pkg}.{info.name}")


def test_every_delta_rule_autotuned_kernel_is_keyed_on_its_work():
    """The scans and gdn's and kda's chunk kernels: each autotuner's key holds ``WORK``
    (``tuning.work_bucket``), and nothing that grows with T: a new T must not re-tune."""
    import inspect

    from triton.runtime.autotuner import Autotuner

    tuned = {f"{m.__name__}.{n}": obj for m in _delta_rule_kernel_modules() for n, obj in vars(m).items()
             if isinstance(obj, Autotuner)}
    assert len(tuned) >= 12, sorted(tuned)
    for name, kernel in tuned.items():
        assert "WORK" in kernel.keys, name
        assert not {"B", "T", "NT", "N", "T_total"} & set(kernel.keys), (name, kernel.keys)
        # a runtime integer, not a constexpr: a new bucket re-tunes but does not recompile
        param = inspect.signature(kernel.fn.fn).parameters["WORK"]
        assert param.annotation is inspect.Parameter.empty, name


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")
def test_a_launch_tunes_apart_by_its_work_not_by_its_length():
    """Through the real launchers (interpreted): the forward scan at one sequence of 40 and of 100
    tokens shares one tuning key; 16 sequences (sixteen times the scan's programs) get their own.
    So do gdn's chunk kernels: the WY inverse at 2 chunks and at 32."""
    from kernel_fun._delta._kernels import state_scan_fwd as scan
    from kernel_fun.gdn._kernels import wy_inverse as inv

    tuning._chosen.clear()
    torch.manual_seed(0)
    for B, T in ((1, 40), (1, 100), (16, 40)):
        q, k, w = (torch.randn(B, T, 1, 16) * 0.1 for _ in range(3))
        scan.state_scan_fwd(q, k, w, torch.randn(B, T, 1, 16), scale=0.25)
    keys = [k for k in tuning._chosen if k[0] == id(scan.state_scan_fwd_kernel_tuned)]
    assert len(keys) == 2, keys
    for B, T in ((1, 100), (16, 100)):
        k = torch.nn.functional.normalize(torch.randn(B, T, 1, 16), dim=-1)
        g = -torch.rand(B, T, 1).cumsum(1)
        inv.wy_inverse(k, g, torch.rand(B, T, 1))
    keys = [k for k in tuning._chosen if k[0] == id(inv.wy_inverse_kernel_tuned)]
    assert len(keys) == 2, keys
