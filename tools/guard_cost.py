"""Host cost of the device guard every public op enters (``_common/device.py: on_device``).

    python tools/guard_cost.py            # CUDA when present (real calls), else mocked CUDA
    python tools/guard_cost.py --mock     # mocked CUDA even on a GPU machine

Mocked CUDA (a machine without a GPU): torch's own Python paths run for real
(``torch.cuda.current_device`` with its ``_lazy_init`` check, ``torch.cuda.device``'s
``__init__``/``_get_device_index``/``__enter__``/``__exit__``); only the C entries they end in
(``torch._C._cuda_getDevice``, ``_exchange_device``, ``_maybe_exchange_device``) are replaced by
C builtins of the same arity (``int``, ``abs``), so the driver's own cost is not counted. On a
GPU the same rows are timed with real calls (the switch row needs two GPUs).

Rows, nanoseconds per ``with ...: pass`` (best of 7 repeats of 200k calls):
  null            ``with contextlib.nullcontext()``: the loop's own floor
  ours_cpu        ``on_device(cpu)``                (CPU tensors under the interpreter)
  ours_same       ``on_device(cuda:0)``, cuda:0 current (the common case: no switch)
  ours_switch     ``on_device(cuda:1)``, cuda:0 current (a real switch and back)
  torch_device    ``torch.cuda.device(t.device)`` always, same device (the plain alternative)
  mark_warm       ``capture.mark_warm`` with the device key, against without (``mark_warm_nodev``)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import timeit


def _time(stmt, n=200_000, repeat=7) -> float:
    return min(timeit.repeat(stmt, number=n, repeat=repeat)) / n * 1e9


def _mock_cuda():
    import torch

    torch.cuda._initialized = True  # _lazy_init returns at once, as after the first CUDA call
    torch._C._cuda_getDevice = int  # () -> 0: device 0 is current
    torch.cuda._exchange_device = abs  # (int) -> int
    torch.cuda._maybe_exchange_device = abs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mock", action="store_true", help="mocked CUDA even where a GPU is present")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)

    import torch

    from kernel_fun._common import capture, device

    real = torch.cuda.is_available() and not args.mock
    if not real:
        _mock_cuda()
    two = real and torch.cuda.device_count() >= 2
    cpu, d0, d1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    if real:
        torch.cuda.set_device(0)
    null = contextlib.nullcontext()
    on = device.on_device
    def floor():
        with null:
            pass

    rows = {"null": _time(floor)}

    def guarded(dev):
        def f():
            with on(dev):
                pass
        return f

    def plain(dev):
        def f():
            with torch.cuda.device(dev):
                pass
        return f

    rows["ours_cpu"] = _time(guarded(cpu))
    rows["ours_same"] = _time(guarded(d0))
    if two or not real:
        rows["ours_switch"] = _time(guarded(d1))
    rows["torch_device"] = _time(plain(d0))
    sig = ((4, 4096, 16, 128), torch.bfloat16)
    rows["mark_warm"] = _time(lambda: capture.mark_warm("kda", sig, "fwd", d0))
    rows["mark_warm_nodev"] = _time(lambda: capture.mark_warm("kda", sig, "fwd"))
    out = {"mode": "cuda" if real else "mocked", "python": sys.version.split()[0], "torch": torch.__version__,
           "ns_per_call": {k: round(v, 1) for k, v in rows.items()}}
    if real:
        out["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
