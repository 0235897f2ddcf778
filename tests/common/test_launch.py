"""``tuning.launch``: an autotuned call whose key was seen goes straight to the jit function with
the configuration Triton's autotuner chose for that key, and every other call goes through the
autotuner (interpreted: a real ``triton.autotune`` over two configurations)."""
import os

import pytest
import torch

from kernel_fun._common import tuning

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")


def _kernel(bench_log: list):
    import triton
    import triton.language as tl

    tuning.install_interpreter_shims()
    def do_bench(kernel_call, quantiles):
        kernel_call()
        bench_log.append(1)
        # the configurations are timed in order; the second is "faster" at every new key
        t = 2.0 if len(bench_log) % 2 else 1.0
        return [t, t, t]

    @triton.jit
    def _scale_rows(x, out, n, N: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        o = pid * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        tl.store(out + o, tl.load(x + o, mask=m, other=0.0) * N, mask=m)

    configs = [triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})]
    return triton.autotune(configs=configs, key=["N"], do_bench=do_bench)(_scale_rows)


def _grid(meta):  # (the interpreter hands runtime arguments to the grid as its tensors)
    return ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)


def test_seen_key_skips_the_autotuner_with_its_pick(monkeypatch):
    bench_log: list = []
    kernel = _kernel(bench_log)
    tuning._chosen.clear()
    runs = []
    real_run = type(kernel).run
    monkeypatch.setattr(type(kernel), "run", lambda self, *a, **k: (runs.append(1), real_run(self, *a, **k))[1])

    x = torch.arange(10, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))
    tuning.launch(kernel, _grid, None, x=x, out=out, n=10, N=3)
    torch.testing.assert_close(out, x * 3)
    assert len(bench_log) == 2 and len(runs) == 1  # tuned once, through the autotuner
    picked = [v for k, v in tuning._chosen.items() if k[0] == id(kernel)]
    assert picked == [(kernel.configs[1], kernel.configs[1].all_kwargs())]

    for n in (10, 7, 1):  # same key (N and the dtypes), other sizes: the jit function, BLOCK 8
        out = torch.full_like(x, float("nan"))
        tuning.launch(kernel, _grid, None, x=x, out=out, n=n, N=3)
        torch.testing.assert_close(out[:n], x[:n] * 3)
        assert out[n:].isnan().all()
    assert len(runs) == 1 and len(bench_log) == 2

    # a new key value, and a new dtype: through the autotuner again, then remembered
    out = torch.empty_like(x)
    tuning.launch(kernel, _grid, None, x=x, out=out, n=10, N=5)
    torch.testing.assert_close(out, x * 5)
    xh, outh = x.half(), torch.empty(10, dtype=torch.float16)
    tuning.launch(kernel, _grid, None, x=xh, out=outh, n=10, N=5)
    torch.testing.assert_close(outh, xh * 5)
    assert len(runs) == 3 and len(bench_log) == 6
    assert kernel.best_config is kernel.configs[1]
    # the fast path leaves best_config at this call's pick, as the autotuner does (launchers read
    # it back): make the half key's pick the first config, then call the float key again
    key_h = next(k for k in tuning._chosen if k[0] == id(kernel) and torch.float16 in k)
    tuning._chosen[key_h] = (kernel.configs[0], kernel.configs[0].all_kwargs())
    tuning.launch(kernel, _grid, None, x=xh, out=outh, n=10, N=5)
    assert kernel.best_config is kernel.configs[0]
    tuning.launch(kernel, _grid, None, x=x, out=torch.empty_like(x), n=10, N=3)
    assert kernel.best_config is kernel.configs[1]
    assert len(runs) == 3


def test_positional_arguments_and_forced_config():
    import triton

    bench_log: list = []
    kernel = _kernel(bench_log)
    tuning._chosen.clear()
    x = torch.arange(6, dtype=torch.float32)
    for _ in range(2):
        out = torch.empty_like(x)
        tuning.launch(kernel, _grid, None, x, out, 6, N=2)
        torch.testing.assert_close(out, x * 2)
    assert len(bench_log) == 2
    out = torch.empty_like(x)
    tuning.launch(kernel, _grid, triton.Config({"BLOCK": 4}), x, out, 6, N=2)
    torch.testing.assert_close(out, x * 2)


def test_pick_with_pre_hook_is_not_remembered():
    class Cfg:
        pre_hook = staticmethod(lambda nargs: None)

        def all_kwargs(self):
            return {"BLOCK": 4}

    calls = []

    class Fake:  # the attributes of an Autotuner that launch reads
        arg_names = ["x", "N"]
        keys = ["N"]
        configs = [Cfg()]

        def __getitem__(self, grid):
            return lambda **kw: calls.append("autotuner")

    tuning._chosen.clear()
    for _ in range(2):
        tuning.launch(Fake(), (1,), None, x=torch.zeros(1), N=1)
    assert calls == ["autotuner", "autotuner"] and not tuning._chosen


def test_not_an_autotuner_goes_through_its_own_launch():
    calls = []

    class Plain:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((a, kw))

    tuning.launch(Plain(), (1,), None, 1, y=2)
    assert calls == [((1,), {"y": 2})]
