"""The command line: ``python -m numba_hopper [check | inspect | bench | prebuild]``, and the
flags every script in ``examples/`` shares (:func:`run_example`).

- ``check`` (also what a bare ``python -m numba_hopper`` does): on a Hopper GPU, run the
  GEMM on random data, check it against float64 and time it (``numba_hopper.tools.selfcheck``),
  then report what the shipped kernels compiled to; with no Hopper GPU, only the report.
- ``inspect [KERNEL ...]``: compile the shipped kernels (all, or those chosen by number or
  by a piece of their label; ``--list`` shows both) for sm_90a and print registers, spills
  and key SASS instructions. ``inspect path/to/file.py:name`` does the same for a
  ``@cuda.jit`` kernel of your own (its declared signature, or ``--signature``). No GPU needed.
- ``bench``: a quick ``gemm`` against cuBLAS (``torch.matmul``) on the GPU.
- ``prebuild``: compile the kernels default calls pick (16-bit ``gemm``/``bmm``, scaled fp8
  ``gemm``, ``grouped_gemm``) into the package (``numba_hopper.tools.prebuild``; no GPU needed).

Nothing is compiled and no CUDA context is created before a command runs: ``--help`` and
``--version`` are instant. A command that needs a Hopper GPU and finds none says so in one
line and exits with status :data:`NO_GPU`; one that needs the CUDA binary utilities and finds
none says how to install them, in one line, and exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pathlib
import platform
import sys
import zlib
from importlib import metadata

from .. import __version__
from ..runtime.device import hopper_device_reason
from .binutils import ToolNotFoundError

__all__ = ["main", "build_parser", "run_example", "report_compiled", "load_kernel", "UsageError", "NO_GPU"]

NO_GPU = 1  # exit status of a command that needs a Hopper GPU when there is none
BENCH_SHAPES = ("4096x4096x4096", "8192x8192x8192")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _no_gpu_line(what: str, reason: str, hint: str) -> str:
    reason = " ".join(reason.split())  # one line, whatever the driver's message was
    return f"{what} needs a Hopper GPU (compute capability 9.x): {reason}. {hint}"


def report_compiled(items, sass=False) -> int:
    """Compile each ``(label, kernel, signature)`` of ``items`` for sm_90a and print its
    summary (registers, spills, key SASS, ptxas warnings) under ``[label]`` (none if the
    label is None), then its whole SASS listing if ``sass``; 1 if any kernel spills, else 0."""
    from .sass import inspect_kernel

    worst = 0
    for label, kernel, signature in items:
        report = inspect_kernel(kernel, signature)
        print(report.summary() if label is None else f"[{label}]\n{report.summary()}", flush=True)
        if sass:
            print(report.sass, flush=True)
        worst = max(worst, report.spill_bytes)
    return 1 if worst else 0


def _shipped():
    from .. import kernels  # looked up at each call: tests replace it

    return kernels.shipped_kernels()


# -- python -m numba_hopper check --------------------------------------------------------------

def _check(args) -> int:
    reason = hopper_device_reason()
    if reason is None:
        from .selfcheck import run_selfcheck

        status = run_selfcheck()
        print("\ncompiled kernels (sm_90a):")
        return report_compiled(_shipped()) or status
    print(f"No Hopper GPU was found ({reason}): compiling the shipped kernels for sm_90a "
          f"and reporting what they became; nothing is run.\n", flush=True)
    return report_compiled(_shipped())


# -- python -m numba_hopper inspect ------------------------------------------------------------

def _select(kernels, words):
    """The kernels that ``words`` choose: numbers (1-based, as ``--list`` shows them), or else
    the words joined by spaces, found in the label (case-insensitive). No words: all."""
    if not words:
        return kernels
    if all(w.isdigit() for w in words):
        numbers = [int(w) for w in words]
        if not all(1 <= i <= len(kernels) for i in numbers):
            return []
        return [kernels[i - 1] for i in numbers]
    query = " ".join(words).lower()
    return [k for k in kernels if query in k[0].lower()]


def _listing(kernels) -> str:
    return "\n".join(f"{i:3d}  {label}" for i, (label, _, _) in enumerate(kernels, 1))


class UsageError(Exception):
    """A command's arguments name nothing it can compile: the message says why (exit status 2)."""


def _is_file_kernel(word: str) -> bool:
    path, colon, name = word.rpartition(":")
    return bool(colon) and path.endswith(".py") and name.isidentifier()


@contextlib.contextmanager
def _declared_signatures():
    """Yield ``{dispatcher: [signature, ...]}``, filled while active by ``@cuda.jit(signature)``,
    which then returns a lazy dispatcher. Given a signature, numba compiles at decoration, for
    the current GPU: that fails on a machine without one, and is not sm_90a on another GPU;
    ``inspect`` compiles for sm_90a itself."""
    from numba import cuda

    jit, declared = cuda.jit, {}

    def lazy_jit(func_or_sig=None, *args, **kwargs):
        if func_or_sig is None or callable(func_or_sig):
            return jit(func_or_sig, *args, **kwargs)
        signatures = func_or_sig if isinstance(func_or_sig, list) else [func_or_sig]

        def decorate(func):
            dispatcher = jit(func, *args, **kwargs)
            declared[dispatcher] = signatures
            return dispatcher

        return decorate

    cuda.jit = lazy_jit
    try:
        yield declared
    finally:
        cuda.jit = jit


def load_kernel(spec: str, signature=None) -> list:
    """``[(label, kernel, signature), ...]`` for ``spec``, ``path/to/file.py:name``: the
    ``@cuda.jit`` kernel ``name`` of that file, imported as a module (its own directory first
    on ``sys.path``, as when it runs as a script, ``__name__`` not ``"__main__"``), for
    ``signature`` or else each signature it was declared with. Raises :class:`UsageError`."""
    path_text, _, name = spec.rpartition(":")
    path = pathlib.Path(path_text).resolve()
    if not path.is_file():
        raise UsageError(f"{spec}: there is no file {path_text!r}")
    module_name = path.stem  # as a script's imports would name it, unless another module has that name
    if getattr(sys.modules.get(module_name), "__file__", str(path)) != str(path):
        module_name += "_%08x" % zlib.crc32(str(path).encode())
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    sys.path.insert(0, str(path.parent))
    try:
        with _declared_signatures() as declared:
            module_spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    kernel = getattr(module, name, None)
    if kernel is None:
        raise UsageError(f"{path_text} has no {name!r}")
    if not hasattr(kernel, "py_func") or not hasattr(kernel, "targetoptions"):
        raise UsageError(f"{spec} is not a @cuda.jit kernel (it is {type(kernel).__name__})")
    if kernel.targetoptions.get("device"):
        raise UsageError(f"{spec} is a device function: inspect a kernel that calls it")
    signatures = [signature] if signature else declared.get(kernel)
    if not signatures:
        raise UsageError(f'{spec} was declared without a signature: give one, e.g. --signature '
                         f'"void(float32[::1], int32)"')
    if len(signatures) == 1:
        return [(None, kernel, signatures[0])]
    return [(f"{spec} {s}", kernel, s) for s in signatures]


def _inspect(args) -> int:
    if args.list:
        print(_listing(_shipped()))
        return 0
    files = [w for w in args.kernel if _is_file_kernel(w)]
    words = [w for w in args.kernel if not _is_file_kernel(w)]
    if args.signature and not files:
        raise UsageError("--signature is for a kernel of your own (path/to/file.py:name)")
    chosen = [item for spec in files for item in load_kernel(spec, args.signature)]
    if words or not files:
        kernels = _shipped()
        shipped = _select(kernels, words)
        if not shipped:
            raise UsageError(f"no shipped kernel matches {' '.join(words)!r}; they are:\n{_listing(kernels)}\n"
                             f"(a kernel of your own: path/to/file.py:name)")
        chosen += shipped
    return report_compiled(chosen, sass=args.sass)


# -- python -m numba_hopper bench --------------------------------------------------------------

def _parse_shape(text: str):
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MxNxK (e.g. 4096x4096x4096)") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every extent must be positive")
    return m, n, k


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _load_bench_gemm():
    """benchmarks/bench_gemm.py of this checkout (it needs PyTorch), or None."""
    path = ROOT / "benchmarks" / "bench_gemm.py"
    if not path.is_file():  # an installed wheel has no benchmarks/
        return None
    spec = importlib.util.spec_from_file_location("_numba_hopper_bench_gemm", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:  # no PyTorch
        return None
    return module


def _bench_builtin(M, N, K, rounds):
    """(ours, cuBLAS or None) TFLOP/s: bf16 in and out, the median of ``rounds`` timings of
    20 calls each with CUDA events; cuBLAS through torch.matmul when PyTorch is installed."""
    import statistics

    import numpy as np
    from numba import cuda

    from ..matmul.api import gemm
    from .selfcheck import _bf16, _time_ms

    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    a = cuda.to_device(_bf16(rng.standard_normal((M, K), dtype=np.float32)))
    b = cuda.to_device(_bf16(rng.standard_normal((K, N), dtype=np.float32)))
    out = cuda.device_array((M, N), dtype=np.uint16)
    flops = 2.0 * M * N * K
    ours = [flops / _time_ms(lambda: gemm(a, b, out, dtype="bf16", out_dtype="bf16")) / 1e9
            for _ in range(rounds)]
    if torch is None:
        return statistics.median(ours), None
    ta = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    tb = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    tc = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    theirs = [flops / _time_ms(lambda: torch.matmul(ta, tb, out=tc)) / 1e9 for _ in range(rounds)]
    return statistics.median(ours), statistics.median(theirs)


def _bench(args) -> int:
    reason = hopper_device_reason()
    if reason is not None:
        print(_no_gpu_line("`python -m numba_hopper bench`", reason,
                           "`python -m numba_hopper inspect` compiles the kernels without one."),
              file=sys.stderr)
        return NO_GPU
    shapes = args.shape or [_parse_shape(s) for s in BENCH_SHAPES]
    bench_gemm = _load_bench_gemm()
    if bench_gemm is not None:
        import torch

        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
        print("bf16, row-major; benchmarks/bench_gemm.py's method (rotating inputs, interleaved rounds)")
        for M, N, K in shapes:
            r = bench_gemm.bench_shape(M, N, K, "bf16", "RR", args.rounds, l2)["default"]
            print(f"{M}x{N}x{K}: numba_hopper {r['ours_tflops']:.1f} TFLOP/s, cuBLAS {r['cublas_tflops']:.1f} "
                  f"TFLOP/s, ratio {r['ratio']:.3f} (out=: {r['out_ratio']:.3f})", flush=True)
        return 0
    print("bf16, row-major; quick timing (CUDA events, no input rotation): "
          "benchmarks/bench_gemm.py measures properly")
    for M, N, K in shapes:
        ours, theirs = _bench_builtin(M, N, K, args.rounds)
        vs = (f", cuBLAS {theirs:.1f} TFLOP/s, ratio {ours / theirs:.3f}" if theirs else
              " (no cuBLAS without PyTorch: pip install 'numba-hopper[torch]', or -e '.[torch]' in a clone)")
        print(f"{M}x{N}x{K}: numba_hopper {ours:.1f} TFLOP/s{vs}", flush=True)
    return 0


# -- python -m numba_hopper prebuild -----------------------------------------------------------

def _prebuild(args) -> int:
    """Hand the arguments after ``prebuild`` to ``numba_hopper.tools.prebuild``, whose own parser
    reads them (``python -m numba_hopper prebuild --help`` shows its options)."""
    from . import prebuild

    return prebuild.main(args.rest) or 0


# -- the parser ----------------------------------------------------------------------------------

class _Version(argparse.Action):
    """``--version``: this package's version and those of what it compiles with, on one line."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the versions of numba-hopper, numba-cuda, numba, NumPy and Python")

    def __call__(self, parser, namespace, values, option_string=None):
        deps = []
        for dist in ("numba-cuda", "numba", "numpy"):
            try:
                deps.append(f"{dist} {metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                deps.append(f"{dist} not installed")
        print(f"numba-hopper {__version__} ({', '.join(deps)}, Python {platform.python_version()})")
        parser.exit()


# (name, what it runs, one-line help, description); a command that takes the rest of the command
# line as its own (prebuild) finds it in ``args.rest``.
COMMANDS = (
    ("check", _check,
     "run and check the GEMM on a Hopper GPU, then report the compiled kernels (no GPU: only the report)",
     "On a Hopper GPU: run the GEMM on random data, check it against float64, time it, then compile the "
     "shipped kernels for sm_90a and report them. Without one: only the report. Exit status 1 if a check "
     "fails or a kernel spills."),
    ("inspect", _inspect,
     "compile the shipped kernels, or a kernel of your own (file.py:name), for sm_90a and print their SASS "
     "summary (no GPU needed)",
     "Compile the shipped kernels (all, or those chosen), or @cuda.jit kernels of your own "
     "(path/to/file.py:name), for sm_90a and print registers, spills, key SASS instructions and ptxas "
     "warnings. No GPU needed. Exit status 1 if a kernel spills."),
    ("bench", _bench,
     "time gemm against cuBLAS (torch.matmul) on a Hopper GPU",
     "Time gemm (bf16) against cuBLAS through torch.matmul on a Hopper GPU, with "
     "benchmarks/bench_gemm.py's method when PyTorch and that file are there, else a quick CUDA-event "
     "timing. Needs a Hopper GPU."),
    ("prebuild", _prebuild,
     "compile the kernels default gemm, bmm, fp8 gemm and grouped_gemm calls pick into the package, so that "
     "those calls compile nothing (no GPU needed)",
     "python -m numba_hopper prebuild [--out DIR] [--jobs N] [--dtypes bf16 f16] [--families ...]: see "
     "`python -m numba_hopper prebuild --help`."),
)
TAKES_THE_REST = {"prebuild"}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m numba_hopper``; each command's function is its ``run`` default."""
    parser = argparse.ArgumentParser(
        prog="python -m numba_hopper",
        description="Hopper (sm_90a) GEMM and intrinsics for numba-cuda: check, inspect and time the "
                    "shipped kernels, inspect your own, prebuild the default set. Without a command: check.",
        epilog="NUMBA_HOPPER_DUMP=ptx,sass also prints the PTX and SASS of every kernel compiled.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, run, summary, description in COMMANDS:
        # a command that takes the rest has its own --help
        commands.add_parser(name, help=summary, description=description,
                            add_help=name not in TAKES_THE_REST).set_defaults(run=run)
    inspect_cmd, bench = commands.choices["inspect"], commands.choices["bench"]
    inspect_cmd.add_argument("kernel", nargs="*", metavar="KERNEL",
                             help="numbers as --list shows them, a piece of a label (e.g. stream-K, "
                                  "'cluster 1x2'), or path/to/file.py:name for a @cuda.jit kernel of your "
                                  "own; default: all the shipped kernels")
    inspect_cmd.add_argument("--list", action="store_true", help="list the shipped kernels; compile nothing")
    inspect_cmd.add_argument("--signature", metavar="SIG",
                             help='argument types of your kernel, e.g. "void(float32[::1], int32)"; default: '
                                  "the signature it was declared with (@cuda.jit(SIG))")
    inspect_cmd.add_argument("--sass", action="store_true", help="also print the whole SASS listing")
    bench.add_argument("--shape", action="append", type=_parse_shape, metavar="MxNxK",
                       help=f"a product to time (repeatable; default {' and '.join(BENCH_SHAPES)})")
    bench.add_argument("--rounds", type=_positive_int, default=5, help="timed rounds per shape (default 5)")
    return parser


def main(argv=None) -> int:
    """``python -m numba_hopper``: parse ``argv`` (default ``sys.argv[1:]``), run the command
    (``check`` when none is given) and return its exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in TAKES_THE_REST:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    run = getattr(args, "run", _check)
    try:
        return run(args)
    except UsageError as exc:
        print(f"python -m numba_hopper {args.command or 'check'}: {exc}", file=sys.stderr)
        return 2
    except ToolNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1


# -- examples/*.py -------------------------------------------------------------------------------

def run_example(run, kernels, doc=None, argv=None) -> None:
    """The command line of a script in ``examples/``: ``run_example(main, KERNELS, __doc__)``.

    ``python examples/NN_name.py`` calls ``run()`` on a Hopper GPU; with none it prints one
    line saying so and exits with status :data:`NO_GPU`. ``--inspect`` compiles ``kernels``
    (``(kernel, signature)`` pairs, as :func:`numba_hopper.tools.sass.inspect_kernel` takes them)
    for sm_90a and prints their summaries instead, with or without a GPU. ``doc`` (the
    example's docstring) is the ``--help`` text; ``argv`` defaults to ``sys.argv[1:]``.
    """
    script = sys.argv[0]
    prog = os.path.basename(script)
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inspect", action="store_true",
                        help="compile the kernel for sm_90a and print registers, spills and key SASS "
                             "instructions instead of running it (no GPU needed)")
    args = parser.parse_args(argv)
    if args.inspect:
        try:
            sys.exit(report_compiled([(None, kernel, signature) for kernel, signature in kernels]))
        except ToolNotFoundError as exc:
            print(exc, file=sys.stderr)
            sys.exit(1)
    reason = hopper_device_reason()
    if reason is not None:
        print(_no_gpu_line(prog, reason, f"`python {script} --inspect` compiles it for sm_90a "
                                         f"and prints its SASS summary without one."), file=sys.stderr)
        sys.exit(NO_GPU)
    run()
