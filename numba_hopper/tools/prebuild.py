"""Build the kernels that calls without a ``config=`` pick, on a machine without a GPU.

    python -m numba_hopper.tools.prebuild [--out DIR] [--jobs N] [--dtypes bf16 f16] [--families ...]

The set is what the heuristics choose for an H100 (132 SMs, 227 KB of shared memory per
block) over walks of shapes, by family:

- "gemm": ``gemm(a, b)`` and ``bmm(a, b)`` of 16-bit inputs (``--dtypes``), no epilogue and
  the input dtype as output, for each operand major, and the fp32 kernels of the products
  that split K;
- "fp8": ``gemm(a, b, scale_a=, scale_b=)`` in the one layout fp8 takes (TN: ``a`` row-major,
  ``b`` column-major), of e4m3 x e4m3 operands (inference, DeepSeek-V3's training) and e5m2 x
  e4m3 ones (a gradient times an e4m3 operand: the backward products of the hybrid recipe),
  output bf16 (the default) or f16, with each scaling as ``torch._scaled_mm`` takes it:
  per-tensor (one-element float32 arrays; also Python numbers), row-wise (vectors) and
  block-wise (``scale_b`` (K/128, N/128) column-major), each promoted (the default
  accumulation: ``use_fast_accum=True`` kernels compile on first use);
- "grouped": ``grouped_gemm`` of 16-bit groups (``--dtypes``, each ``b[g]`` row- or
  column-major, output the input dtype) and of e4m3 groups, unscaled or with block-wise scales
  (each group's ``scale_b`` column-major, as ``torch._scaled_mm`` and DeepGEMM lay them out),
  promoted, output bf16 or f16; contiguous and masked, without a fused epilogue.

A kernel is its config and the numba types of its launch's arguments (:class:`Kernel`),
which name its entry together. A scale array's layout types its argument ("C" or "F" where
contiguous, else "A"), so scales of another layout (a row-major block-wise ``scale_b``, say)
make another kernel, compiled on first use like those of other fused epilogues, fp8 outputs,
unscaled fp8 products (and number scales whose product is 1: the plain kernel) and the other
fp8 pairs. Each kernel is compiled in a worker process
(``numba_hopper._numba_internals.compile_kernel``), linked for sm_90a and written cubin-only
under the name the kernel cache looks up (``runtime.kernel_cache.entry_name``), with a
manifest the loader checks (``runtime.kernel_cache.prebuilt_status``). The directory is
replaced whole: a reader sees the old set, none, or the new one.

The split-K reduce and the copies of unaligned operands are launched without a cache key:
they are compiled in every process that needs them, and are not part of the set.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import itertools
import json
import multiprocessing
import os
import pathlib
import shutil
import tempfile
import time
from typing import NamedTuple

from numba.cuda import types

from ..runtime import kernel_cache as _kernel_cache
from .. import _numba_internals as _internals
from ..runtime.arrays import ITEMSIZE, DeviceView, tma_addressable, transpose
from ..matmul.extra_launches import aligned_layout
from ..matmul.fusion import check_fusion, fusion_args, numba_array_type
from ..matmul.heuristics import choose_config, grouped_config, narrow_config, split_count
from ..matmul.plan import gemm_cache_key, split_k_config
from ..matmul.scales import fold_scales
from ..kernels import gemm_argument_types
from ..kernels.gemm_config import FP8_DTYPES, KBLOCK_SCALE, GemmConfig
from ..kernels.gemm_sm90 import make_gemm_kernel
from ..kernels.operands import OPERAND
from ..runtime.launch import DeviceLimits

__all__ = ["H100", "FAMILIES", "Kernel", "kernel_set", "launch_types", "build"]

H100 = DeviceLimits(device=0, cc=(9, 0), sm_count=132, max_shared_per_block_optin=232448)
# numba links a launch on a 9.0 device for sm_90a: CUDACodeLibrary._ensure_cc adds the "a".
CUBIN_CC = (*H100.cc, "a")
FAMILIES = ("gemm", "fp8", "grouped")

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

# fp8 gemm, over gemm's M and N: (a, b) dtypes, outputs, scalings (the module doc), and K
# short and long for block-wise tiles (heuristics.LONG_K_BLOCKS); the other scalings' tiles do
# not depend on K. (Checked against M and N every multiple of 64 up to 4096 and of 256 up to
# 16384 and ragged sizes, with K of 256, 2048, 6016, 6144 and 65536: the same set.)
FP8_PAIRS = (("e4m3", "e4m3"), ("e5m2", "e4m3"))
FP8_OUTS = ("bf16", "f16")
SCALINGS = ("tensor", "number", "rowwise", "blockwise")
FP8_KS = (512, 16384)
# grouped_gemm: group counts, rows per group (a contiguous call's mean, a masked call's M),
# mixture-of-experts widths, and K short and long enough for a group of one to split K (whose
# slices decide its tile). (Checked against G of 1-512 by powers of 2 and 3, every multiple of
# 32 rows up to 1024 and of 512 up to 8192, N every multiple of 256 up to 8192 and of 1024 up
# to 24576, K of 256-32768: the same set.)
GROUPS = (1, 4, 8, 16, 32, 64, 128, 256)
GROUP_ROWS = (1, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192)
GROUP_NS = (256, 512, 1024, 1536, 2048, 2816, 4096, 5120, 7168, 14336, 24576)
GROUP_KS = (512, 16384)


class Kernel(NamedTuple):
    """A kernel of the set: its config and the numba types of the arguments its launch passes
    (``matmul.plan._Gemm.prepare``; :func:`launch_types`), which name its entry together."""

    cfg: GemmConfig
    argtypes: tuple

    @property
    def entry(self) -> str:
        """The file name of its entry, as the kernel cache looks it up on an H100."""
        return _kernel_cache.entry_name(gemm_cache_key(self.cfg), self.argtypes, H100.cc)

    @property
    def family(self) -> str:
        return "grouped" if self.cfg.grouped else "fp8" if self.cfg.in_dtype in FP8_DTYPES else "gemm"


def launch_types(cfg: GemmConfig, arrays=None) -> tuple:
    """The numba types of what the launch of ``cfg``'s kernel passes: ``arrays`` are the types of
    its array operands (name -> type: the fused epilogue's, whose other arguments are float32
    numbers, and B's block-wise scales, "b_block_scales"), as ``_array_types`` finds them."""
    arrays = arrays or {}
    epilogue = None if cfg.epilogue is None else tuple(arrays.get(n, types.float32) for n in cfg.epilogue.arg_names)
    return gemm_argument_types(cfg, epilogue, arrays.get("b_block_scales"))


def _array_types(operands) -> tuple:
    """``((name, numba type), ...)`` of the arrays among ``operands`` (name -> view or number)
    that the launch passes as arrays (``fusion.numba_array``, read as the operand's ``bits``;
    tensor maps carry the others)."""
    return tuple((name, numba_array_type(v, OPERAND[name].bits)) for name, v in operands.items()
                 if isinstance(v, DeviceView) and OPERAND[name].kernel != "map")


def _view(rows, cols, dtype, row_major, ptr=1 << 20):
    """A view with a 16-byte-aligned address and a dense leading dimension."""
    strides = (cols, 1) if row_major else (1, rows)
    return DeviceView(ptr, (rows, cols), strides, dtype, ITEMSIZE[dtype], 0, "numba")


# --- 16-bit gemm and bmm ----------------------------------------------------------------


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


def _gemm_configs(dtypes, limits, refused):
    """The configs of the 16-bit gemm and bmm walk (``kernel_set``'s ``refused``)."""
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
                yield cfg
                if units == 1:  # a training step's tiles (gemm(config="sustained")), where they differ
                    yield choose_config(a, b, out, None, False, limits=limits, sustained=True)
                narrow = narrow_config(a, b, out, limits) if units == 1 else None
                if narrow is not None:  # gemm computes these swapped (matmul.plan.gemm_plan)
                    yield choose_config(transpose(b), transpose(a), transpose(out), narrow, False, limits=limits)
                if units == 1 and split_count(cfg, M, N, K, limits.sm_count) > 1:  # bmm does not split
                    yield split_k_config(cfg, limits.max_shared_per_block_optin)


# --- fp8 gemm: the scaled calls ---------------------------------------------------------


class _Scale:
    """A float32 device array's interface at address 0: what the call path reads of a scale
    (its layout). ``strides`` in elements (None: C-contiguous)."""

    def __init__(self, shape, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides and tuple(4 * s for s in strides),
                                         "typestr": "<f4", "data": (0, False), "version": 3}


def _scales(scaling, M, N, K):
    """``(scale_a, scale_b)`` of a call of ``scaling``, laid out as ``torch._scaled_mm`` takes them."""
    if scaling == "tensor":
        return _Scale(()), _Scale(())
    if scaling == "number":
        return 0.5, 3.0
    if scaling == "rowwise":
        return _Scale((M,)), _Scale((N,))
    kb, nb = -(-K // KBLOCK_SCALE), -(-N // KBLOCK_SCALE)
    return _Scale((M, kb), (1, M)), _Scale((kb, nb), (1, kb))


def _fp8_fusions(scaling, M, N, K):
    """The checked epilogues of the calls of ``scaling`` at this shape (the call path's:
    ``scales.fold_scales``, ``fusion.check_fusion``; the same for every fp8 pair and output).
    A per-tensor scale is a stride-0 vector, but torch's ``expand(1)`` leaves a one-element
    vector (M or N of 1) contiguous, which types the kernel's argument "C": both."""
    a, b = _view(M, K, "e4m3", True), _view(K, N, "e4m3", False)
    alpha, row_scale, col_scale, blocks = fold_scales(a, b, *_scales(scaling, M, N, K), 1.0, None, None)
    args = fusion_args(alpha, 0.0, None, None, None, None, None, None, (), row_scale, col_scale, blocks)
    fusion = check_fusion(args, M, N, K, 0, None, FP8_OUTS[0])
    yield fusion
    torch_ones = {name: dataclasses.replace(v, strides=(1,)) for name, v in fusion.operands.items()
                  if isinstance(v, DeviceView) and v.shape == (1,) and v.strides == (0,)}
    if torch_ones:
        yield dataclasses.replace(fusion, operands={**fusion.operands, **torch_ones})


def _fp8_kernels(limits):
    """``(config, array types)`` of the scaled fp8 walk's kernels, as ``matmul.plan.gemm_plan``
    chooses them: a row-major out, TMA-addressable or written through an aligned copy; scaled
    calls do not split."""
    for scaling, M, N, K in itertools.product(SCALINGS, SIZES, SIZES, FP8_KS):
        for fusion in _fp8_fusions(scaling, M, N, K):
            arrays = _array_types(fusion.operands)
            for (a_dtype, b_dtype), out_dtype in itertools.product(FP8_PAIRS, FP8_OUTS):
                out = _view(M, N, out_dtype, True)
                if not tma_addressable(out, True):
                    out = aligned_layout(out)[0]
                yield choose_config(_view(M, K, a_dtype, True), _view(K, N, b_dtype, False), out, None, False,
                                    fusion.config(False), limits=limits, block_scaled=fusion.block_scaled,
                                    promoted=True), arrays


# --- grouped_gemm -----------------------------------------------------------------------


def _grouped_kernels(dtypes, limits):
    """``(config, array types)`` of the grouped walk's kernels, as ``matmul.plan.grouped_plan``
    chooses them: ``a`` the whole (rows, K) matrix (contiguous) or group 0's (M, K) one
    (masked), ``b`` group 0's (K, N)."""
    for G, rows, N, K, mode in itertools.product(GROUPS, GROUP_ROWS, GROUP_NS, GROUP_KS, ("contiguous", "masked")):
        M = rows if mode == "masked" else rows * G
        for dtype, b_row in itertools.product(dtypes, (True, False)):
            yield grouped_config(_view(M, K, dtype, True), _view(K, N, dtype, b_row), _view(M, N, dtype, True), mode,
                                 G, None, False, limits=limits), ()
        kb, nb = -(-K // KBLOCK_SCALE), -(-N // KBLOCK_SCALE)
        scales = _array_types({"b_block_scales": DeviceView(0, (G, kb, nb), (kb * nb, 1, kb), "f32", 4, 0, "numba")})
        for out_dtype, block_scaled in itertools.product(FP8_OUTS, (True, False)):  # (scale_b column-major)
            yield grouped_config(_view(M, K, "e4m3", True), _view(K, N, "e4m3", False), _view(M, N, out_dtype, True),
                                 mode, G, None, False, limits=limits, block_scaled=block_scaled,
                                 promoted=True), scales if block_scaled else ()


def kernel_set(dtypes=("bf16", "f16"), limits=H100, refused=None, families=FAMILIES) -> set:
    """The :class:`Kernel` of every kernel the default heuristics pick on a ``limits`` device
    for the walks of ``families`` (see the module doc); ``dtypes``: the 16-bit inputs.
    ``refused``: a list that gets ``(dtype, M, N, K, units, a_major, b_major, error)`` for each
    case of the 16-bit gemm walk where ``choose_config`` raised (the call raises too: there is
    nothing to build)."""
    found = set()
    if "gemm" in families:
        found.update((cfg, ()) for cfg in _gemm_configs(dtypes, limits, refused))
    if "fp8" in families:
        found.update(_fp8_kernels(limits))
    if "grouped" in families:
        found.update(_grouped_kernels(dtypes, limits))
    return {Kernel(cfg, launch_types(cfg, dict(arrays))) for cfg, arrays in found}


# --- the build --------------------------------------------------------------------------


def _build_one(kernel: Kernel) -> tuple:
    """``(entry name, entry bytes, what it was built from)`` of ``kernel`` (in a worker)."""
    compiled = _internals.compile_kernel(make_gemm_kernel(kernel.cfg), kernel.argtypes, CUBIN_CC)
    return kernel.entry, _internals.serialize_cubin_kernel(compiled, CUBIN_CC), _kernel_cache.build_identity()


def _described(kernel: Kernel) -> str:
    """The manifest's text for ``kernel``: its config, and its array arguments' types, which tell
    the kernels of one config apart."""
    arrays = [str(t) for group in kernel.argtypes for t in getattr(group, "types", ()) if isinstance(t, types.Array)]
    return " ".join([repr(kernel.cfg), *arrays])


def _linking_cuda() -> str:
    """The CUDA version (``major.minor``) of the nvJitLink that links the cubins."""
    from cuda.bindings import nvjitlink

    return "%d.%d" % nvjitlink.version()


def build(out: pathlib.Path, kernels, jobs: int) -> dict:
    """Compile ``kernels`` (each a :class:`Kernel`) with ``jobs`` processes into the directory ``out``
    (replaced whole); return the manifest written."""
    out = pathlib.Path(out).resolve()
    manifest = dict(_kernel_cache.build_identity(), linked_with_cuda=_linking_cuda(), cc=list(H100.cc), entries={})
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".new"))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide an installed package's set from other users
    try:
        kernels = sorted(kernels, key=repr)
        # spawn: workers start clean rather than forking a process that loaded libNVVM.
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            built = list(pool.map(_build_one, kernels))
        for kernel, (name, data, source) in zip(kernels, built):
            if source != _kernel_cache.build_identity():
                raise RuntimeError("the package's sources changed during the build: build again")
            (staging / name).write_bytes(data)
            manifest["entries"][name] = _described(kernel)
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
    p.add_argument("--dtypes", nargs="+", choices=("bf16", "f16"), default=["bf16", "f16"],
                   help="the 16-bit inputs of the gemm and grouped families")
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    args = p.parse_args(argv)
    start = time.perf_counter()
    refused = []
    kernels = kernel_set(tuple(args.dtypes), refused=refused, families=args.families)
    counts = collections.Counter(k.family for k in kernels)
    print(f"{len(kernels)} kernels ({', '.join(f'{family} {counts[family]}' for family in args.families)}; "
          f"16-bit: {', '.join(args.dtypes)}), set found in {time.perf_counter() - start:.1f} s")
    if refused:
        *case, error = refused[0]
        print(f"warning: choose_config raised for {len(refused)} cases of the walk, e.g. "
              f"(dtype, M, N, K, units, a_major, b_major) = {tuple(case)}: {error}")
    manifest = build(args.out, kernels, args.jobs)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"built {len(manifest['entries'])} kernels in {time.perf_counter() - start:.0f} s with {args.jobs} jobs: "
          f"{size / 1e6:.2f} MB in {args.out}")


if __name__ == "__main__":
    main()
