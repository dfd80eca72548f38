"""Build the kernels a default ``gemm``/``bmm`` call can pick, on a machine without a GPU.

    python -m numba_hopper.tools.prebuild [--out DIR] [--jobs N] [--dtypes bf16 f16]

The set is what the heuristics choose for an H100 (132 SMs, 227 KB of shared memory per
block) over a grid of shapes: every GEMM kernel of ``gemm(a, b)`` and ``bmm(a, b)`` with
16-bit inputs, no epilogue, no ``config=`` and the input dtype as output, for each operand
major, and the fp32 kernels of the products that split K. Each is compiled in a worker
process (``numba_hopper._numba_internals.compile_kernel``), linked for sm_90a and written
cubin-only under the name the kernel cache looks up (``runtime.kernel_cache.entry_name``), with
a manifest the loader checks (``runtime.kernel_cache.prebuilt_status``). The directory is
replaced whole: a reader sees the old set, none, or the new one.

The split-K reduce and the copies of unaligned operands are launched without a cache key:
they are compiled in every process that needs them, and are not part of the set.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import shutil
import tempfile
import time

from ..runtime import kernel_cache as _kernel_cache
from .. import _numba_internals as _internals
from ..runtime.arrays import DeviceView, tma_addressable, transpose
from ..matmul.heuristics import choose_config, narrow_config, split_count
from ..matmul.plan import gemm_cache_key, split_k_config
from ..kernels import gemm_argument_types
from ..kernels.gemm_config import GemmConfig
from ..kernels.gemm_sm90 import make_gemm_kernel
from ..runtime.launch import DeviceLimits

__all__ = ["H100", "kernel_set", "build"]

H100 = DeviceLimits(device=0, cc=(9, 0), sm_count=132, max_shared_per_block_optin=232448)
# numba links a launch on a 9.0 device for sm_90a: CUDACodeLibrary._ensure_cc adds the "a".
CUBIN_CC = (*H100.cc, "a")

# gemm's M and N: every 64 up to 1024, then coarser (where waves, not single tiles, decide),
# and sizes that are no multiple of anything. (Checked against a walk of every multiple of
# 32 up to 16384, seven K from 256 to 65536 and 18 batch counts: the same set; a walk of
# sizes 8 (mod 328) with five K from 1000 to 16392, whose rows straddle sectors, adds none.)
SIZES = sorted({1, 8, 65, 96, 129, *range(64, 1025, 64), *range(1280, 4097, 256), *range(5120, 16385, 1024),
                1000, 1001, 1792, 3000, 5000, 12345})
# K: short, long enough for every rule that needs a long K loop (clusters: 2048, split-K), and
# rows of K-major operands that straddle 32-byte sectors (3000: 6000 bytes).
KS = (512, 3000, 16384)
# bmm's batch counts, over fewer M: the batch multiplies the tile count.
UNITS = (2, 3, 5, 8, 16, 64, 512)
BMM_MS = (1, 65, 128, 512, 2048, 4096)
BMM_NS = sorted({1, 65, *range(128, 4097, 128)})


def _shapes():
    """``(M, N, K, units)`` of the walk: gemm's (units 1), then bmm's."""
    for M in SIZES:
        for N in SIZES:
            for K in KS:
                yield M, N, K, 1
    for units in UNITS:
        for M in BMM_MS:
            for N in BMM_NS:
                for K in KS:
                    yield M, N, K, units


def _view(rows, cols, dtype, row_major):
    """A view with a 16-byte-aligned address and a dense leading dimension."""
    strides = (cols, 1) if row_major else (1, rows)
    return DeviceView(1 << 20, (rows, cols), strides, dtype, 2, 0, "numba")


def _operands(M, N, K, units, dtype):
    """``(a, b, out)`` views for every operand major TMA can read at this shape. gemm and bmm
    copy the other operands (and an unaligned output) row-major (``matmul.plan._aligned``):
    one of these."""
    out = _view(M, N, dtype, True)
    for a_row in (True, False):
        a = _view(M, K, dtype, a_row)
        for b_row in (True, False):
            b = _view(K, N, dtype, b_row)
            if tma_addressable(a, a_row) and tma_addressable(b, b_row):
                yield a, b, out


def kernel_set(dtypes=("bf16", "f16"), limits=H100, refused=None) -> set:
    """The ``GemmConfig`` of every kernel the default heuristics pick on a ``limits`` device
    for the shape walk (see the module doc), split-K variants included. ``refused``: a list
    that gets ``(dtype, M, N, K, units, a_major, b_major, error)`` for each case where
    ``choose_config`` raised (the call raises too: there is nothing to build)."""
    configs = set()
    for dtype in dtypes:
        for M, N, K, units in _shapes():
            for a, b, out in _operands(M, N, K, units, dtype):
                try:
                    cfg = choose_config(a, b, out, None, False, units=units, limits=limits)
                except ValueError as exc:
                    if refused is not None:
                        majors = ("K" if a.strides[1] == 1 else "M", "N" if b.strides[1] == 1 else "K")
                        refused.append((dtype, M, N, K, units, *majors, str(exc)))
                    continue
                configs.add(cfg)
                narrow = narrow_config(a, b, out, limits) if units == 1 else None
                if narrow is not None:  # gemm computes these swapped (matmul.plan.gemm_plan)
                    configs.add(choose_config(transpose(b), transpose(a), transpose(out), narrow, False, limits=limits))
                if units == 1 and split_count(cfg, M, N, K, limits.sm_count) > 1:  # bmm does not split
                    configs.add(split_k_config(cfg, limits.max_shared_per_block_optin))
    return configs


def _build_one(cfg: GemmConfig) -> tuple:
    """``(entry name, entry bytes, what it was built from)`` of ``cfg``'s kernel (in a worker)."""
    argtypes = gemm_argument_types(cfg)
    kernel = _internals.compile_kernel(make_gemm_kernel(cfg), argtypes, CUBIN_CC)
    name = _kernel_cache.entry_name(gemm_cache_key(cfg), argtypes, H100.cc)
    return name, _internals.serialize_cubin_kernel(kernel, CUBIN_CC), _kernel_cache.build_identity()


def _linking_cuda() -> str:
    """The CUDA version (``major.minor``) of the nvJitLink that links the cubins."""
    from cuda.bindings import nvjitlink

    return "%d.%d" % nvjitlink.version()


def build(out: pathlib.Path, configs, jobs: int) -> dict:
    """Compile ``configs`` with ``jobs`` processes into the directory ``out`` (replaced whole);
    return the manifest written."""
    out = pathlib.Path(out).resolve()
    manifest = dict(_kernel_cache.build_identity(), linked_with_cuda=_linking_cuda(), cc=list(H100.cc), entries={})
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".new"))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide an installed package's set from other users
    try:
        configs = sorted(configs, key=repr)
        # spawn: workers start clean rather than forking a process that loaded libNVVM.
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            built = list(pool.map(_build_one, configs))
        for cfg, (name, data, source) in zip(configs, built):
            if source != _kernel_cache.build_identity():
                raise RuntimeError("the package's sources changed during the build: build again")
            (staging / name).write_bytes(data)
            manifest["entries"][name] = repr(cfg)
        (staging / _kernel_cache.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        old = None
        if out.exists():
            old = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".old"))
            os.replace(out, old / out.name)
        os.replace(staging, out)
        if old is not None:
            shutil.rmtree(old)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m numba_hopper.tools.prebuild", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=_kernel_cache.PREBUILT_DIR,
                   help="directory to (re)create (default: the package's %(default)s)")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="worker processes (default: %(default)s)")
    p.add_argument("--dtypes", nargs="+", choices=("bf16", "f16"), default=["bf16", "f16"])
    args = p.parse_args(argv)
    start = time.perf_counter()
    refused = []
    configs = kernel_set(tuple(args.dtypes), refused=refused)
    print(f"{len(configs)} kernels for {', '.join(args.dtypes)} (set found in {time.perf_counter() - start:.1f} s)")
    if refused:
        *case, error = refused[0]
        print(f"warning: choose_config raised for {len(refused)} cases of the walk, e.g. "
              f"(dtype, M, N, K, units, a_major, b_major) = {tuple(case)}: {error}")
    manifest = build(args.out, configs, args.jobs)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"built {len(manifest['entries'])} kernels in {time.perf_counter() - start:.0f} s with {args.jobs} jobs: "
          f"{size / 1e6:.2f} MB in {args.out}")


if __name__ == "__main__":
    main()
