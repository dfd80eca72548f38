"""The command line (CPU): ``python -m numba_hopper`` and the examples' ``--inspect``.

Only the last test compiles anything (one small kernel).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from numba_hopper.tools import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _no_compiling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nothing should be compiled here")

    monkeypatch.setattr("numba_hopper.tools.sass.inspect_kernel", refuse)
    monkeypatch.setattr(cli, "report_compiled", refuse)


def _without_gpu_env():
    """This environment without numba/numba_hopper settings, and with no GPU visible."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    return env


def test_help_prints_usage_and_exits_0():
    out = subprocess.run([sys.executable, "-m", "numba_hopper", "--help"], capture_output=True, text=True,
                         cwd=ROOT, env=_without_gpu_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m numba_hopper")
    for command in ("check", "inspect", "bench"):
        assert command in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["inspect", "--help"], ["bench", "--help"]])
def test_help_compiles_nothing(argv, monkeypatch, capsys):
    _no_compiling(monkeypatch)
    monkeypatch.setattr(cli, "_shipped", lambda: pytest.fail("--help built the kernels"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m numba_hopper")


def test_no_command_is_check(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "_check", lambda args: calls.append(args) or 7)
    assert cli.main([]) == 7 and len(calls) == 1


def test_inspect_lists_and_selects_without_compiling(monkeypatch, capsys):
    _no_compiling(monkeypatch)
    chosen = []
    monkeypatch.setattr(cli, "report_compiled", lambda items: chosen.append([label for label, _, _ in items]) or 0)
    labels = [label for label, _, _ in cli._shipped()]

    assert cli.main(["inspect", "--list"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split(None, 1) for line in listing] == [[str(i), label] for i, label in enumerate(labels, 1)]

    assert cli.main(["inspect", "2", "4"]) == 0
    assert chosen.pop() == [labels[1], labels[3]]
    assert cli.main(["inspect", "STREAM-K"]) == 0  # a piece of a label, any case
    assert chosen.pop() == [label for label in labels if "stream-k" in label.lower()] != []
    assert cli.main(["inspect", "cluster", "1x2"]) == 0  # words joined: "cluster 1x2"
    assert chosen.pop() == [label for label in labels if "cluster 1x2" in label] != []
    assert cli.main(["inspect"]) == 0
    assert chosen.pop() == labels

    for argv in (["inspect", "no such kernel"], ["inspect", str(len(labels) + 1)]):
        assert cli.main(argv) == 2
        assert "no shipped kernel matches" in capsys.readouterr().err
    assert not chosen


def test_bench_without_gpu_says_so_in_one_line(monkeypatch, capsys):
    _no_compiling(monkeypatch)
    monkeypatch.setattr(cli, "hopper_device_reason", lambda: "no CUDA driver or GPU found")
    assert cli.main(["bench"]) == cli.NO_GPU != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    line, = captured.err.splitlines()
    assert "needs a Hopper GPU" in line and "no CUDA driver or GPU found" in line and "inspect" in line


def test_bench_rejects_a_bad_shape(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--shape", "12x3"])
    assert exit_.value.code == 2
    assert "MxNxK" in capsys.readouterr().err


def _example(*args):
    return subprocess.run([sys.executable, str(ROOT / "examples" / "01_tma_copy.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, env=_without_gpu_env(), timeout=300)


def test_example_without_gpu_says_so_in_one_line():
    out = _example()
    assert out.returncode == cli.NO_GPU != 0
    assert out.stdout == ""
    line, = out.stderr.splitlines()  # no traceback
    assert line.startswith("01_tma_copy.py needs a Hopper GPU (compute capability 9.x): ")
    assert "--inspect" in line


def test_example_inspect_compiles_for_sm90a_without_gpu():
    out = _example("--inspect")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tma_copy [sm_90a]\n")
    assert "UTMALDG" in out.stdout and "UTMASTG" in out.stdout
