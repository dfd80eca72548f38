"""The command line (CPU): ``python -m numba_hopper``, the examples' ``--inspect`` and the
install hints. Only the ``inspect`` of a user's kernel and the examples' ``--inspect`` compile
anything (small kernels).
"""

import importlib
import os
import pathlib
import subprocess
import sys
from importlib import metadata

import pytest

import numba_hopper
from numba_hopper.tools import cli, sass_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_KERNELS = ROOT / "tests" / "_user_kernels.py"


def _no_compiling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nothing should be compiled here")

    monkeypatch.setattr("numba_hopper.tools.sass.inspect_kernel", refuse)
    monkeypatch.setattr(cli, "report_compiled", refuse)


def _without_gpu_env():
    """This environment without numba/numba_hopper settings but the SASS report cache (a re-run
    reads back what the first compiled), and with no GPU visible."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") or k == sass_cache.ENV}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    return env


def test_help_prints_usage_and_exits_0():
    out = subprocess.run([sys.executable, "-m", "numba_hopper", "--help"], capture_output=True, text=True,
                         cwd=ROOT, env=_without_gpu_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m numba_hopper")
    for command in ("check", "inspect", "bench", "prebuild"):
        assert command in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["inspect", "--help"], ["bench", "--help"]])
def test_help_compiles_nothing(argv, monkeypatch, capsys):
    _no_compiling(monkeypatch)
    monkeypatch.setattr("numba_hopper.kernels.shipped_kernels", lambda: pytest.fail("--help built the kernels"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m numba_hopper")


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"numba-hopper {numba_hopper.__version__} (numba-cuda {metadata.version('numba-cuda')}, ")
    assert metadata.version("numba-hopper") == numba_hopper.__version__  # pyproject.toml reads it from the package


def test_no_command_is_check(monkeypatch, capsys):
    shipped = [("a kernel", None, None)]
    reported = []
    monkeypatch.setattr(cli, "hopper_device_reason", lambda: "no CUDA driver or GPU found")
    monkeypatch.setattr("numba_hopper.kernels.shipped_kernels", lambda: shipped)
    monkeypatch.setattr(cli, "report_compiled", lambda items, sass=False: reported.append(items) or 7)
    assert cli.main([]) == 7
    assert reported == [shipped]
    assert capsys.readouterr().out.startswith("No Hopper GPU was found (no CUDA driver or GPU found): compiling")


def test_unknown_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["inspect", "--no-such-flag"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_inspect_lists_and_selects_without_compiling(monkeypatch, capsys):
    from numba_hopper.kernels import shipped_kernels

    _no_compiling(monkeypatch)
    chosen = []
    monkeypatch.setattr(cli, "report_compiled",
                        lambda items, sass=False: chosen.append([label for label, _, _ in items]) or 0)
    labels = [label for label, _, _ in shipped_kernels()]

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


# -- inspect path/to/file.py:name -------------------------------------------------------------------

def _inspect(capsys, *argv):
    status = cli.main(["inspect", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_inspect_a_users_kernel_with_its_declared_signature(capsys):
    # Declared with @cuda.jit(signature), which numba would compile at import for the current GPU
    # (and fail to, without one): inspect compiles it for sm_90a instead, and prints the SASS too.
    status, out, err = _inspect(capsys, f"{USER_KERNELS}:declared", "--sass")
    assert status == 0, err
    summary, listing = out.split("\t.target\tsm_90a", 1)  # nvdisasm's listing opens with its target
    assert summary.startswith("declared [sm_90a]\n  registers ") and "key SASS: none" in summary
    assert "_user_kernels8declared" in listing and "EXIT ;" in listing


def test_inspect_a_users_kernel_with_a_signature_given(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    spec = "tests/_user_kernels.py:undeclared"  # a path relative to the working directory
    status, out, err = _inspect(capsys, spec)  # no signature declared, none given
    assert status == 2 and out == ""
    assert "declared without a signature" in err and "--signature" in err

    status, out, err = _inspect(capsys, spec, "--signature", "void(int32[::1], int64)")
    assert status == 0, err
    assert out.startswith("undeclared [sm_90a]\n")


@pytest.mark.parametrize("spec, message", [
    ("tests/no_such_file.py:k", "there is no file 'tests/no_such_file.py'"),
    (f"{USER_KERNELS}:missing", "has no 'missing'"),
    (f"{USER_KERNELS}:NOT_A_KERNEL", "is not a @cuda.jit kernel (it is int)"),
    (f"{USER_KERNELS}:twice", "is a device function"),
])
def test_inspect_a_users_file_explains_what_it_cannot_compile(spec, message, monkeypatch, capsys):
    _no_compiling(monkeypatch)
    monkeypatch.chdir(ROOT)
    status, out, err = _inspect(capsys, spec)
    assert status == 2 and out == ""
    line, = err.splitlines()
    assert line.startswith("python -m numba_hopper inspect: ") and message in line


def test_inspect_imports_a_users_file_as_a_script_would(tmp_path, monkeypatch, capsys):
    # its own directory first on sys.path (a sibling module imports), not run as __main__
    (tmp_path / "sibling_constants.py").write_text("WIDTH = 4\n")
    (tmp_path / "my_kernels.py").write_text(
        "from numba import cuda\nfrom sibling_constants import WIDTH\n\n"
        "@cuda.jit\ndef scale(x):\n    x[cuda.grid(1) % WIDTH] = 0\n\n"
        "if __name__ == '__main__':\n    raise SystemExit('ran as a script')\n")
    _no_compiling(monkeypatch)
    status, _, err = _inspect(capsys, f"{tmp_path / 'my_kernels.py'}:scale")
    assert status == 2 and "declared without a signature" in err
    assert str(tmp_path) not in sys.path  # put back as it was


def test_inspect_signature_is_only_for_a_users_kernel(monkeypatch, capsys):
    _no_compiling(monkeypatch)
    status, _, err = _inspect(capsys, "1", "--signature", "void(int32)")
    assert status == 2 and "--signature is for a kernel of your own" in err


# -- prebuild ---------------------------------------------------------------------------------------

def test_prebuild_is_a_subcommand(monkeypatch, capsys):
    from numba_hopper.tools import prebuild

    received = []
    monkeypatch.setattr(prebuild, "main", lambda argv: received.append(argv))
    argv = ["--out", "some/dir", "--jobs", "3", "--dtypes", "bf16"]
    assert cli.main(["prebuild", *argv]) == 0
    assert received == [argv]
    monkeypatch.undo()

    with pytest.raises(SystemExit) as exit_:  # its own options, from its own parser
        cli.main(["prebuild", "--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    assert all(option in usage for option in ("--out", "--jobs", "--dtypes"))


# -- install hints ----------------------------------------------------------------------------------

def test_missing_tools_are_one_line_naming_both_installs(monkeypatch, capsys):
    from numba_hopper.tools.binutils import find_tool

    monkeypatch.setattr(cli, "report_compiled", lambda items, sass=False: find_tool("no-such-cuda-tool"))
    assert cli.main(["inspect", "1"]) == 1
    captured = capsys.readouterr()
    line, = captured.err.splitlines()
    assert "pip install 'numba-hopper[inspect]'" in line and "pip install -e '.[inspect]'" in line


def test_torch_layer_without_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` finds when it is not installed
    for name in [m for m in sys.modules if m == "numba_hopper.torch" or m.startswith("numba_hopper.torch.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as raised:
        importlib.import_module("numba_hopper.torch")
    message = str(raised.value)
    assert "pip install 'numba-hopper[torch]'" in message and "pip install -e '.[torch]'" in message
    assert isinstance(raised.value.__cause__, ModuleNotFoundError) and raised.value.__cause__.name == "torch"


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
