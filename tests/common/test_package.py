"""The package root and the doctor."""
import os
import shutil
import subprocess
import sys

import kernel_fun
from kernel_fun import __main__ as cli
from kernel_fun._common import compat


def test_import_is_cheap():
    code = ("import sys, kernel_fun; "
            "heavy = [m for m in ('torch', 'triton', 'fla') if m in sys.modules]; "
            "print(heavy); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_versions():
    v = kernel_fun.versions()
    assert v["kernel_fun"] == kernel_fun.__version__
    for key in ("python", "torch", "triton", "fla", "cuda", "device"):
        assert key in v
    assert v["fla"] == "0.6.0"


def test_doctor_on_this_machine(capsys):
    compat.reset()
    rc = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "fla drift check: ok" in out
    assert kernel_fun.__version__ in out
    import torch

    if not torch.cuda.is_available():
        assert "no CUDA device" in out


def test_doctor_without_fla_exits_nonzero(monkeypatch, capsys):
    monkeypatch.setattr(compat, "_fla_version", lambda: None)
    compat.reset()
    try:
        rc = cli.main(["doctor"])
    finally:
        monkeypatch.undo()
        compat.reset()
    out = capsys.readouterr().out
    assert rc == 1 and "pip install" in out


def test_doctor_with_drift_exits_nonzero(monkeypatch, capsys):
    import fla.ops.kda

    monkeypatch.delattr(fla.ops.kda, "chunk_kda")
    compat.reset()
    try:
        rc = cli.main(["doctor"])
    finally:
        monkeypatch.undo()
        compat.reset()
    assert rc == 2 and "chunk_kda" in capsys.readouterr().out


def test_console_script_entry():
    # both entries reach the CLI (the doctor itself is tested in process above: as a subprocess
    # it spends about 10 s importing fla's modules for the drift check)
    import importlib.metadata as md

    cmds = [[sys.executable, "-m", "kernel_fun", "--help"]]
    try:
        md.distribution("kernel-fun")
    except md.PackageNotFoundError:
        pass  # run from a source tree on PYTHONPATH (the GPU image): no script was installed
    else:  # installed (pip install -e . or a wheel): its console script too
        script = os.path.join(os.path.dirname(sys.executable), "kernel-fun")
        script = script if os.path.exists(script) else shutil.which("kernel-fun")
        assert script, "kernel-fun is installed but its script is neither beside this python nor on PATH"
        cmds.append([script, "--help"])
    for cmd in cmds:
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0, (cmd, out.stderr)
        assert "{doctor,bench,check}" in out.stdout, out.stdout


def test_bench_without_gpu_runs_the_check(capsys):
    import torch

    if torch.cuda.is_available():
        return
    # one family (the check of every family is tests/*/test_check.py's and `kernel-fun check`'s),
    # in process (the CLI's entries are test_console_script_entry's)
    rc = cli.main(["bench", "--family", "cconv"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "timings need a CUDA GPU" in out
    assert "check cconv: ok" in out and "check kda" not in out


def test_import_and_doctor_work_without_fla(tmp_path):
    # fla made unimportable and invisible to importlib.metadata in a fresh interpreter
    code = (
        "import sys, importlib.metadata as md\n"
        "sys.modules['fla'] = None\n"
        "real = md.version\n"
        "def version(name):\n"
        "    if name in ('fla-core', 'flash-linear-attention'): raise md.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "md.version = version\n"
        "import kernel_fun\n"
        "assert kernel_fun.versions()['fla'] is None\n"
        "from kernel_fun.__main__ import main\n"
        "sys.exit(main(['doctor']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "pip install 'fla-core" in out.stdout
