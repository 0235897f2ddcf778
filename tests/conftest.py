"""Test tiers: CPU tests run our Triton kernels through Triton's interpreter; `-m gpu` tests
need CUDA and are skipped without it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Test helpers shared across folders (``family_modules``) import by name: pytest runs with
# --import-mode=importlib (pyproject.toml), which puts no test folder on sys.path.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _has_cuda()
# Must be set before any kernel module is imported: triton.jit reads it at decoration time.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_uninterpreted(tmp_path):
    """``run(code, name)``: ``code`` written to ``tmp_path/name`` and run by this Python without
    TRITON_INTERPRET (``triton.jit`` reads a kernel's source from its file, and the compile checks need
    real jit functions); returns the ``CompletedProcess``."""
    def run(code: str, name: str = "check.py") -> subprocess.CompletedProcess:
        f = tmp_path / name
        f.write_text(code)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, str(f)], env=env, capture_output=True, text=True, timeout=900)
    return run


@pytest.fixture
def device():
    """Where kernels run: the GPU when there is one, else CPU tensors through the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def clean_state(monkeypatch):
    """No KERNEL_FUN_* switches, and the per-process caches (log-once, warm signatures, fla
    drift status, static verdicts, patch_fla's last look at the imported modules) forgotten before and
    after the test."""
    from kernel_fun import patch
    from kernel_fun._common import capture, compat, gate, report

    for k in list(os.environ):
        if k.startswith("KERNEL_FUN_"):
            monkeypatch.delenv(k)
    resets = (report.reset_logged, capture.reset_warm, compat.reset, gate.Verdicts.reset_all, patch.reset_scan)
    for reset in resets:
        reset()
    yield
    for reset in resets:
        reset()


@pytest.fixture
def fla_recorder(monkeypatch):
    """``install(ops_module, result)``: replace a family's route to fla with a recorder (fla's
    kernels do not interpret); returns the list of kwargs each routed call passed."""

    def install(ops_module, result):
        calls = []

        def fake(**kw):
            calls.append(kw)
            return result

        monkeypatch.setattr(ops_module, "fla_symbol", lambda mod, sym: fake)
        return calls

    return install


@pytest.fixture
def poison_outputs(monkeypatch):
    """Every output a launcher allocates (``_common.tuning.alloc``) starts as NaN, so an element
    a kernel forgets to write fails the comparison."""
    from kernel_fun._common import tuning

    monkeypatch.setattr(tuning, "POISON_OUTPUTS", True)


def _captured(step, clone):
    """``step()`` called eagerly three times on a side stream (PyTorch's recipe for capturing fwd +
    bwd; it also makes the call signatures warm), then captured in a CUDA graph and replayed:
    (what the replay left in the captured outputs, ``clone(out)`` of the last eager call's)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            eager = clone(step())
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    graph.replay()
    torch.cuda.synchronize()
    return static, eager


@pytest.fixture
def graph_replay():
    """``run(step) -> (static, eager)``: ``_captured`` for a fwd + bwd ``step()`` returning a tensor
    or a tuple of them."""
    import torch

    def run(step):
        return _captured(step, lambda out: out.clone() if isinstance(out, torch.Tensor) else [t.clone() for t in out])

    return run


@pytest.fixture
def runtime_contract(no_memory_growth):
    """``check(step)``: design.md's runtime checks of a fwd + bwd ``step()`` that returns a dict of
    detached tensors (None where absent) with an ``"o"``: a second call bitwise the same
    (determinism); a fresh ``o`` each call (no aliasing); bitwise the same on a busy non-default
    stream; bitwise the same replayed from a CUDA graph (warmed on a side stream first); no live
    memory growth over 50 more calls."""
    import torch

    def check(step):
        eager = {k: v.clone() for k, v in step().items() if v is not None}
        again = step()
        for k, v in eager.items():
            assert torch.equal(v, again[k]), k
        assert again["o"].data_ptr() != step()["o"].data_ptr()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(10_000_000)  # keep the stream busy so that a wrong-stream launch races
            on_s = step()
        torch.cuda.current_stream().wait_stream(s)
        for k, v in eager.items():
            assert torch.equal(v, on_s[k]), k
        static, _ = _captured(step, lambda out: None)
        for k, v in eager.items():
            assert torch.equal(static[k], v), k
        del static
        no_memory_growth(step, 50)

    return check


@pytest.fixture
def compile_counts():
    """``count(fn, inputs, backward=True)``: graph breaks and unique graphs when
    ``torch.compile(fn, dynamic=True)`` runs on each argument tuple of ``inputs`` (forward, and
    backward of the output's sum when asked). The design's rule: our op adds no graph break and
    no recompile beyond fla's for the same call."""

    def count(fn, inputs, backward=True):
        import torch
        import torch._dynamo as dynamo
        from torch._dynamo.utils import counters

        dynamo.reset()
        counters.clear()
        compiled = torch.compile(fn, dynamic=True)
        for args in inputs:
            out = compiled(*args)
            if backward:
                out.float().sum().backward()
        return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]

    return count


def persistent_growth(growth, window: int = 10) -> bool:
    """Whether live memory measured after each of a run of calls (bytes above the baseline) grew to
    stay: above the baseline at every one of the last ``window`` measurements. A leak never comes
    back to the baseline (it grows, or holds what it kept); a call's outputs that sometimes outlive it
    by a moment and are gone at a later measurement (the H100, 2026-12-05: gdn's fwd + bwd alternated
    between 0 and one call's gradients in no regular order, docs/gdn.md twenty-eighth session) do."""
    return min(growth[-window:]) > 0


@pytest.fixture
def no_memory_growth():
    """``check(step, n)``: run ``step()`` n times after a baseline and assert that the live CUDA
    memory (``memory_allocated``) comes back to the baseline within the last ten calls
    (``persistent_growth``). On failure the message gives the growth after each step (one-off or per
    step: a leak grows each step) and the live blocks allocated after the baseline with the Python
    frames that allocated them."""
    import torch

    def check(step, n):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        try:
            growth = []
            for _ in range(n):
                step()
                torch.cuda.synchronize()
                growth.append(torch.cuda.memory_allocated() - base)
            snap = torch.cuda.memory._snapshot() if persistent_growth(growth) else None
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        if snap is None:
            return
        live = [(b["size"], [f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"
                             for f in b.get("frames") or [] if f["filename"].endswith(".py")][:6])
                for seg in snap["segments"] for b in seg["blocks"]
                if b["state"] == "active_allocated" and b.get("frames")]
        live.sort(key=lambda r: -r[0])
        raise AssertionError(f"live CUDA memory grew: base {base} B, growth after each step {growth}; "
                             f"{len(live)} live blocks allocated after the baseline (largest first): {live[:5]}")

    return check
