"""Plans: everything about a GEMM call but its operands' addresses and its stream.

A plan is built once per call layout (the plan cache, :mod:`.plan_cache`, keys it on what
decides the kernel: shapes, strides, dtypes, alignment, device, the epilogue's signature) and
run on every call with that layout. A call passes its *values*: ``values[SCRATCH]`` is the
address of the device scratch the plan asked for (``numba_hopper.runtime.workspace``), then the
addresses of ``a``, ``b`` and ``out``, then one value for each of the call's other operands in
the order of their table (``numba_hopper.kernels.operands.OPERANDS``: a number, or an array's
address, 0 where absent; ``VALUE_INDEX`` names their indices), then the user epilogue's arrays
(``USER + i``), a grouped call's group sizes (``GROUP_ROWS``) or a sum's other pairs (:func:`pair_values`).

Each operand of a launch is a view plus a :class:`Src` naming the value it lives at. The
launches are prepared once, against the first call's values, and record where each value
lands in their packed arguments (``binds``); a later call only rewrites those before
launching. The GEMM kernel takes its tensor maps by value (``tensormap.TensorMapArg``),
encoded once per plan; a call at new addresses sets each map's address word, so it costs
the host a store per operand and never waits for the device.
"""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import numpy as np
from cuda.bindings import driver

from ..runtime.arrays import DeviceView, canonical, is_col_major, is_row_major, leading_dim, tma_addressable, transpose
from .extra_launches import aligned_layout, prepare_copy, prepare_reduce
from .fusion import VALUE_OPERANDS, Fusion, is_array, numba_array, user_arg
from .heuristics import (SUSTAINED, choose_config, grouped_config, max_stages, narrow_config, split_count,
                          stream_k_schedule, swappable)
from .placement import tpc_order
from ..runtime.workspace import ALIGN, CLAIMS_BYTES, alloc_scratch, free_scratch
from ..runtime.debug import DebugRecord
from ..errors import LayoutError
from ..kernels.epilogue import c_box_cols
from ..kernels.epilogue_config import EpilogueArgs, EpilogueConfig
from ..kernels.gemm_config import EPI_ROWS, FP8_DTYPES, KBLOCK_BYTES, GemmConfig, GemmParams
from ..kernels.operands import OPERAND
from ..kernels.gemm_sm90 import make_gemm_kernel
from ..kernels.scheduler import GROUP_WALK_END
from ..runtime.launch import device_limits, max_active_clusters, prepare_launch
from ..runtime.tensormap import TensorMapArg, encode_template

__all__ = ["Plan", "gemm_plan", "gemm_sum_plan", "glu_backward_plan", "bmm_plan", "grouped_plan", "zero_fill_plan", "split_k_config",
           "gemm_cache_key", "SCRATCH", "A", "B", "OUT", "VALUE_OPERANDS", "VALUE_INDEX", "USER", "GROUP_ROWS",
           "values_packer", "pair_values"]

# Indices into a call's values (the module doc).
SCRATCH, A, B, OUT = range(4)
VALUE_INDEX = {op.name: OUT + 1 + i for i, op in enumerate(VALUE_OPERANDS)}
USER = OUT + 1 + len(VALUE_OPERANDS)  # USER + i: the i-th array among the user epilogue's arguments
GROUP_ROWS = USER  # a grouped call's group sizes (grouped calls take no user epilogue)


def pair_values(i):
    """The value indices of a ``gemm_sum`` call's pair ``i``: pair 0's are A and B, pair i's
    ``USER + 2 (i - 1)`` and the next (a sum takes no user epilogue)."""
    return (A, B) if i == 0 else (USER + 2 * i - 2, USER + 2 * i - 1)

# Whether GEMM kernels launch as programmatic dependents ("all", the default, or "none"): each
# sets up its barriers, waits in griddepcontrol.wait for the previous kernel of the stream, and
# lets the next start its set-up once it has issued its last load. Back to back, measured on
# the H100: 1.0-1.4 us less per decode call, 6-12% less time for 15-25 us products, long
# products within 3%. From NUMBA_HOPPER_PDL at import; a plan keeps what it was built with.
DEPENDENT_LAUNCH = os.environ.get("NUMBA_HOPPER_PDL", "all")


def values_packer(names, extra=()):
    """``pack(*values) -> fvalues``: a call's values after OUT (``VALUE_OPERANDS``' order, then
    ``extra``'s) from the values of the operands ``names`` (a None among them: an argument
    ignored) and of ``extra``, in that order; every other operand's value is 0. Compiled once
    into a function that returns a tuple literal, so that a call packs its values as cheaply
    as a hand-written tuple would."""
    unknown = set(names) - set(VALUE_INDEX) - {None}
    if unknown:
        raise ValueError(f"not a call operand: {sorted(unknown)}")
    params = [name or f"_ignored{i}" for i, name in enumerate(names)] + list(extra)
    slots = [op.name if op.name in names else "0" for op in VALUE_OPERANDS] + list(extra)
    return eval(f"lambda {', '.join(params)}: ({', '.join(slots)},)")  # noqa: S307 (built from our own names)


class Src(NamedTuple):
    """Where an operand lives in a call: ``values[index] + offset``."""

    index: int
    offset: int = 0

    def resolve(self, values):
        return values[self.index] + self.offset


@dataclasses.dataclass(frozen=True)
class Operand:
    """A view (its address: any call's, or 0 for scratch) and the value that places it."""

    view: DeviceView
    src: Src

    def at(self, values) -> DeviceView:
        return dataclasses.replace(self.view, ptr=self.src.resolve(values))

    def t(self) -> "Operand":
        return Operand(transpose(self.view), self.src)


class _Scratch:
    """A bump allocator for the plan's scratch regions (offsets from ``values[SCRATCH]``), and
    the cluster claims before them (``numba_hopper.runtime.workspace``)."""

    def __init__(self):
        self.size, self.claimed = 0, False

    def take(self, nbytes) -> Src:
        offset = self.size
        self.size += -(-nbytes // ALIGN) * ALIGN
        return Src(SCRATCH, offset)

    def claims(self) -> Src:
        self.claimed = True
        return Src(SCRATCH, -CLAIMS_BYTES)


def _binds(leaves, srcs):
    """``(parameter index, Src)`` pairs for an argument's leaves and its sources (same nesting;
    a None source keeps the packed value)."""
    if srcs is None:
        return []
    if isinstance(leaves, list):
        return [pair for leaf, src in zip(leaves, srcs) for pair in _binds(leaf, src)]
    return [(leaves, srcs)]


def _launch_step(launch, srcs):
    """A prepared launch as a plan step: ``(launch, binds)``, where each call's values go."""
    return launch, tuple((p, s.index, s.offset) for leaves, arg in zip(launch.leaves, srcs)
                         for p, s in _binds(leaves, arg))


class _Memset:
    """Zero ``rows`` rows of ``width`` bytes, ``pitch`` bytes apart, at ``src``."""

    def __init__(self, src, width, rows=1, pitch=0):
        self.src, self.width, self.rows, self.pitch = src, width, rows, pitch or width

    def prepare(self, values):
        return self, ()

    def __call__(self, stream, values, binds=()):
        if self.rows == 1:
            (err,) = driver.cuMemsetD8Async(self.src.resolve(values), 0, self.width, stream)
        else:
            (err,) = driver.cuMemsetD2D8Async(self.src.resolve(values), self.pitch, 0, self.width, self.rows, stream)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"memset of {self.rows} x {self.width} bytes failed: {err}")


class _Copy:
    """``dst = src`` through the copy kernel: 2-D views, or 3-D ones (a batch of matrices) in
    one launch."""

    def __init__(self, src: Operand, dst: Operand):
        self.src, self.dst = src, dst

    def prepare(self, values):
        return _launch_step(prepare_copy(self.src.at(values), self.dst.at(values)), (self.src.src, self.dst.src))


class _Reduce:
    """Split-K's second kernel: sum the f32 slices in ``partials`` into ``out``, times a
    scale-only epilogue's factors: ``alpha`` (a :class:`Src`), ``row_scale``/``col_scale``
    (:class:`Operand` vectors), each None when absent."""

    def __init__(self, partials: Operand, out: Operand, alpha=None, row_scale=None, col_scale=None):
        self.partials, self.out = partials, out
        self.alpha, self.row_scale, self.col_scale = alpha, row_scale, col_scale

    def prepare(self, values):
        vectors = (self.row_scale, self.col_scale)
        launch = prepare_reduce(self.partials.at(values), self.out.at(values),
                                None if self.alpha is None else self.alpha.resolve(values),
                                *(None if v is None else v.at(values) for v in vectors))
        srcs = (self.partials.src, None, self.out.src)
        if self.alpha is not None or any(v is not None for v in vectors):  # absent ones: placeholders, never read
            srcs += (self.alpha, *(None if v is None else v.src for v in vectors))
        return _launch_step(launch, srcs)


@dataclasses.dataclass(frozen=True)
class _Batch:
    """The batch (or K-slice) dimension of a launch: unit count and element strides."""

    count: int = 1
    a: int = 0  # 0: one A for every unit
    b: int = 0
    c: int = 0
    k_split: int = 0  # k-blocks per unit when the units are K slices
    a_scales: int = 0  # A's block-wise scales (masked groups: one (K blocks, M) matrix per unit)


class _Gemm:
    """One launch of the persistent GEMM kernel of ``cfg`` over ``batch`` units.

    ``fusion``: the fused epilogue of a single product, in kernel coordinates, with ``c``
    placed apart from its other arrays (``arrays``: the epilogue's, name -> Operand), as are
    the mainloop's: ``a_scales`` and ``b_scales`` (A's and B's block-wise scales; A's as (K
    blocks, M), row-major) and ``up`` (a gated product's B_up), each an :class:`Operand` or
    None. The kernel reads C, A's scales and B_up through tensor maps, B's scales as
    ``GemmParams.b_scales``. ``grid``/``dp_tiles``: a stream-K launch's schedule, or a
    grouped one's grid. ``group_rows``: where a grouped launch's group sizes are (a :class:`Src`).
    ``segments``: a K-segmented launch's (``cfg.k_segments``) other ``(a, b)`` pairs of
    :class:`Operand` like ``a`` and ``b``; the kernel runs their K loops after ``a @ b``'s.
    ``glu``: a GLU backward's (``cfg.glu``) ``(up, d_up)``, its up products (read like ``c``, the
    gate's) and second output (written like ``d``). ``products``: a gated kernel's (``cfg.gated_aux``)
    two (M, N) products, B's and B_up's, written in sub-tiles of the raw accumulator.
    """

    def __init__(self, cfg, a, b, d, batch, scratch, *, fusion=None, c=None, a_scales=None, b_scales=None, up=None,
                 arrays=None, user_srcs=(), grid=None, dp_tiles=0, record=None, group_rows=None, segments=(),
                 glu=(), products=()):
        self.cfg, self.a, self.b, self.d, self.c, self.batch = cfg, a, b, d, c, batch
        self.segments, self.glu, self.products = segments, glu, products
        self.a_scales, self.b_scales, self.up = a_scales, b_scales, up
        self.fusion, self.arrays, self.user_srcs = fusion, arrays or {}, user_srcs
        self.dp_tiles, self.record, self.group_rows = dp_tiles, record, group_rows
        M, N = self._kernel_shape()
        limits = device_limits(d.view.device)
        tiles = batch.count * -(-M // (cfg.block_m * cfg.cluster_m)) * -(-N // (cfg.block_n * cfg.cluster_n))
        self.grid = grid or min(tiles * cfg.cluster_size, limits.sm_count)  # whole clusters: trimmed in prepare
        self.partials = scratch.take(self.grid * 2 * (cfg.partial_bytes + 4)) if cfg.stream_k else None
        self.claims = scratch.claims() if cfg.cluster_order == "gpc" or cfg.dynamic_schedule else None

    def _kernel_shape(self):
        """The kernel's (M, N): the output's, with a gated kernel's columns B's and B_up's."""
        M, N = self.d.view.shape
        return M, 2 * N if self.cfg.gated else N

    def _templates(self, values):
        cfg, batch = self.cfg, self.batch
        # K-major A: (M, K) rows of 64 k; M-major A: stored (K, M), 64 x 64 boxes.
        a = self.a.at(values)
        maps = [encode_template(_batched(a if cfg.a_major == "K" else transpose(a), batch.count, batch.a),
                                cfg.a_box, swizzle=128)]
        # K-major B: stored (N, K); N-major B: (K, N), 64 x 64 boxes.
        b = self.b.at(values)
        maps.append(encode_template(_batched(transpose(b) if cfg.b_major == "K" else b, batch.count, batch.b),
                                    cfg.b_box, swizzle=cfg.b_swizzle))
        d = self.d.at(values)  # column-major: the kernel's rows run along the stored rows
        maps.append(encode_template(_batched(transpose(d) if cfg.out_major == "M" else d, batch.count, batch.c),
                                    cfg.c_box, swizzle=cfg.epi_swizzle))
        c_box = (1, EPI_ROWS, c_box_cols(cfg)) if cfg.has_c else None
        if self.c is not None:
            c = self.c.at(values)
            maps.append(encode_template(_batched(c, 1, 0), c_box, swizzle=c_box[2] * c.itemsize))
        if self.a_scales is not None:  # one k-block's scales of a tile's rows per box
            maps.append(encode_template(_batched(self.a_scales.at(values), batch.count, batch.a_scales),
                                        (1, 1, cfg.a_scales_box)))
        if self.up is not None:  # like B
            maps.append(encode_template(_batched(transpose(self.up.at(values)), batch.count, batch.b), cfg.b_box,
                                        swizzle=cfg.b_swizzle))
        for a, b in self.segments:  # like A and B
            a, b = a.at(values), b.at(values)
            maps.append(encode_template(_batched(a if cfg.a_major == "K" else transpose(a), 1, 0), cfg.a_box,
                                        swizzle=128))
            maps.append(encode_template(_batched(transpose(b) if cfg.b_major == "K" else b, 1, 0), cfg.b_box,
                                        swizzle=cfg.b_swizzle))
        if self.glu:  # the up products like C, the second output like D
            up, d_up = (op.at(values) for op in self.glu)
            maps.append(encode_template(_batched(up, 1, 0), c_box, swizzle=c_box[2] * up.itemsize))
            maps.append(encode_template(_batched(d_up, 1, 0), cfg.c_box, swizzle=cfg.epi_swizzle))
        for product in self.products:
            maps.append(encode_template(_batched(product.at(values), 1, 0), cfg.aux_box, swizzle=128))
        return maps

    def _epilogue_args(self, values):
        """The kernel's :class:`EpilogueArgs` and where each call's values of it come from."""
        args, srcs = {}, {}
        for name in self.cfg.epilogue.arg_names:
            if OPERAND[name].form == "args":
                args[name], srcs[name] = tuple(map(user_arg, self.fusion.user_args)), list(self.user_srcs)
            elif name in self.arrays:
                op = self.arrays[name]
                args[name], srcs[name] = numba_array(op.at(values), OPERAND[name].bits), op.src
            else:  # a number
                index = VALUE_INDEX[name]
                args[name], srcs[name] = np.float32(values[index]), Src(index)
        return EpilogueArgs(**args), [srcs.get(field) for field in EpilogueArgs._fields]

    def prepare(self, values):
        cfg, batch = self.cfg, self.batch
        M, N = self._kernel_shape()
        K, k_begins = self.a.view.shape[1], (0, 0)
        operands = (self.a, self.b, self.d) + tuple(op for op in (self.c, self.a_scales, self.up) if op is not None)
        if self.segments:  # each segment's k-blocks after the previous segment's
            ends = np.cumsum([-(-a.view.shape[1] // cfg.block_k) for a in (self.a, *(a for a, _ in self.segments))])
            K, k_begins = int(ends[-1]) * cfg.block_k, (int(ends[0]), int(ends[1]))
            operands += tuple(op for pair in self.segments for op in pair)
        operands += tuple(self.glu) + tuple(self.products)
        params = GemmParams(
            maps=tuple(TensorMapArg(m, op.src.resolve(values)) for m, op in zip(self._templates(values), operands)),
            M=M, N=N, K=K, batches=batch.count, a_batched=int(batch.a != 0), b_batched=int(batch.b != 0),
            k_split=batch.k_split, dp_tiles=self.dp_tiles,
            workspace=self.partials.resolve(values) if self.partials else 0,
            debug_record=self.record.address if self.record else 0,
            group_rows=self.group_rows.resolve(values) if self.group_rows else 0,
            out_address=self.d.src.resolve(values) if self.group_rows else 0,
            tpc_order=tpc_order(self.d.view.device) if cfg.cluster_order == "gpc" else 0,
            cluster_claims=self.claims.resolve(values) if self.claims else 0,
            b_scales=numba_array(self.b_scales.at(values)) if self.b_scales else 0, k_begins=k_begins)
        # Where each call's value of a field comes from (None: fixed at preparation).
        params_srcs = [None] * len(GemmParams._fields)
        params_srcs[GemmParams._fields.index("maps")] = [op.src for op in operands]
        params_srcs[GemmParams._fields.index("workspace")] = self.partials
        params_srcs[GemmParams._fields.index("group_rows")] = self.group_rows
        params_srcs[GemmParams._fields.index("out_address")] = self.d.src if self.group_rows else None
        params_srcs[GemmParams._fields.index("cluster_claims")] = self.claims
        params_srcs[GemmParams._fields.index("b_scales")] = self.b_scales and self.b_scales.src
        ep, ep_srcs = self._epilogue_args(values) if cfg.epilogue is not None else ((), None)
        args, srcs = (params, ep), (params_srcs, ep_srcs)
        kernel = make_gemm_kernel(cfg)
        # The on-disk cache keys a kernel on the package's sources and the config's repr; a
        # user epilogue function is neither (its repr is an address, its code is the caller's),
        # so such kernels are compiled in every process rather than risk loading a stale one.
        user_code = cfg.epilogue is not None and cfg.epilogue.user is not None
        cache_key = None if user_code else gemm_cache_key(cfg)
        grid = self.grid
        if cfg.cluster_size > 1:  # GPCs hold fewer whole clusters than SMs / cluster size
            resident = max_active_clusters(kernel, cfg.cluster_size, cfg.threads, args,
                                           shared_mem=cfg.shared_bytes, cache_key=cache_key)
            # In GPC order every TPC takes a slot, a tile or not: the slots of a GPC stay consecutive.
            gpc = cfg.cluster_order == "gpc"
            grid = (resident if gpc else min(grid // cfg.cluster_size, resident)) * cfg.cluster_size
        launch = prepare_launch(kernel, grid, cfg.threads, args, shared_mem=cfg.shared_bytes, cache_key=cache_key,
                                cluster=cfg.cluster_size if cfg.cluster_size > 1 else None, dependent=_dependent())
        gemm = _launch_step(launch, srcs)
        if not cfg.stream_k:
            return gemm
        flags = _Memset(Src(SCRATCH, self.partials.offset + self.grid * 2 * cfg.partial_bytes), self.grid * 2 * 4)

        def stream_k(stream, values, binds):  # the fix-up's flags start at zero
            flags(stream, values)
            launch(stream, values, binds)

        return stream_k, gemm[1]


def _dependent():
    if DEPENDENT_LAUNCH not in ("none", "all"):
        raise ValueError(f"NUMBA_HOPPER_PDL must be all or none; got {DEPENDENT_LAUNCH!r}")
    return DEPENDENT_LAUNCH == "all"


def gemm_cache_key(cfg):
    """The on-disk cache key of the GEMM kernel of ``cfg`` (``launch.prepare_launch``)."""
    return "gemm_sm90", cfg


def _batched(v, count, stride):
    """The row-major 2-D view ``v`` repeated ``count`` times, ``stride`` elements apart.

    A ``stride`` of 0 (one matrix for every unit) is a batch dimension of 1: the kernel
    reads it at batch coordinate 0. TMA wants every stride a multiple of 16 bytes, also of
    a dimension of 1, so a single matrix gets its own size as the stride.
    """
    v = canonical(v)
    if stride == 0:
        count, stride = 1, v.shape[0] * v.strides[0]
    return dataclasses.replace(v, shape=(count, *v.shape), strides=(stride, *v.strides))


class Plan:
    """The steps of a call, prepared on its first run; ``plan(stream, values)`` runs them on
    the ``CUstream`` handle ``stream``. A step is ``(callable, binds)``, called as
    ``callable(stream, values, binds)`` (a :class:`~numba_hopper.runtime.launch.PreparedLaunch`, or a
    memset with no binds).
    """

    def __init__(self, device, specs, scratch=None, record=None):
        self.device, self.specs, self.record = device, specs, record
        self.scratch_bytes, self.claims = (scratch.size, scratch.claimed) if scratch else (0, False)
        self._steps = None

    def __call__(self, stream, values):
        """Run on ``stream``; ``values``: a list, whose SCRATCH entry this sets to scratch taken
        and given back in ``stream``'s order (``runtime.workspace``: also inside a CUDA graph
        being captured)."""
        scratch = 0
        if self.scratch_bytes or self.claims:
            values[SCRATCH] = scratch = alloc_scratch(self.device, stream, self.scratch_bytes, self.claims)
        try:
            for step, binds in self._steps or self._prepare(values):
                step(stream, values, binds)
        finally:
            if scratch:
                free_scratch(scratch, stream)
        if self.record is not None:
            self.record.synchronize(stream)

    def _prepare(self, values):
        self._steps = [spec.prepare(values) for spec in self.specs]
        self.specs = ()  # and what they held of the first call
        return self._steps


def _aligned(op: Operand, scratch, copies, row_major_only=False):
    """``op`` if TMA can read it (either major, unless ``row_major_only``), else a scratch copy
    of it, whose copy step is added to ``copies``."""
    return _aligned_batch(op, 1, 0, scratch, copies, row_major_only)[0]


def _aligned_batch(op: Operand, count, stride, scratch, copies, row_major_only=False):
    """``(operand, stride)``: ``count`` matrices like ``op``'s, ``stride`` elements apart (0: one
    matrix for all), as TMA reads them: themselves if it can (either major, unless
    ``row_major_only``, and a batch stride of a multiple of 16 bytes), else an aligned scratch
    copy of all of them, one copy step added to ``copies``."""
    v = op.view
    if (tma_addressable(v, True) or (not row_major_only and tma_addressable(v, False))) \
            and (stride * v.itemsize) % 16 == 0:
        return op, stride
    count = count if stride else 1
    layout, nbytes = aligned_layout(v)
    copy = Operand(layout, scratch.take(count * nbytes))
    copy_stride = nbytes // v.itemsize if count > 1 else 0
    copies.append(_Copy(_stacked(op, count, stride), _stacked(copy, count, copy_stride)))
    return copy, copy_stride


def _stacked(op: Operand, count, stride):
    """``op`` (a 2-D view) as the 3-D view of ``count`` such matrices ``stride`` elements apart;
    ``op`` itself for one."""
    if count == 1:
        return op
    v = op.view
    return Operand(dataclasses.replace(v, shape=(count, *v.shape), strides=(stride, *v.strides)), op.src)


_SWAPPED = {"row_scale": "col_scale", "col_scale": "row_scale"}


def gemm_plan(va, vb, vo, fusion: Fusion | None, config, debug, split_k=None, fast_accum=False):
    """The plan of ``out = a @ b`` (with ``fusion``) for these checked views.

    A column-major ``out`` is computed as ``out.T = b.T @ a.T``: the same kernel on swapped,
    transposed operands. So is a plain decode product (a few rows: ``heuristics.narrow_config``),
    or a call whose ``config`` has ``out_major = "M"``: the kernel then writes the column-major
    ``out.T``. Operands TMA cannot address go through aligned scratch copies.
    ``amax_out`` is zeroed (a memset on the stream) before the kernel raises it. ``split_k``:
    the K slices (None: :func:`~.heuristics.split_count`'s, for plain calls without a config;
    the call checked it). K == 0 (an epilogue of a zero product): the kernel runs on one
    k-block of zeros (:func:`_zero_k_block`), unsplit. fp8 products promote their sums into f32
    every 128 K unless ``fast_accum`` (block-wise scaled ones always do). ``config`` "sustained":
    the default's choice for products run back to back at the power limit
    (:func:`~.heuristics.sustained_clusters_pay`).
    """
    sustained = config == SUSTAINED
    if sustained:
        config = None
    a, b, d = Operand(va, Src(A)), Operand(vb, Src(B)), Operand(vo, Src(OUT))
    scratch, copies, zeros = _Scratch(), [], []
    c, arrays, user_srcs = None, {}, ()
    if fusion:
        arrays = {name: Operand(v, Src(VALUE_INDEX[name])) for name, v in fusion.operands.items()
                  if isinstance(v, DeviceView)}
        user_srcs = _user_sources(fusion.user_args)
    if va.shape[1] == 0:
        a, b, zeros = _zero_k_block(va, vb, scratch)
        arrays = {**arrays, "up": b} if "up" in arrays else arrays  # (a gated product's B_up: zeros like b)
        split_k = None
    forced_split = split_k is not None and split_k > 1
    if config is not None and config.out_major == "M":
        if fusion or forced_split or not swappable(va, vb, vo):
            raise ValueError("a config with out_major = 'M' computes the product swapped, which takes plain 16-bit "
                             "products with a and out row-major and TMA-addressable, and no split_k")
        narrow = config
    else:
        narrow = None if fusion or config is not None or forced_split else narrow_config(
            va, vb, vo, device_limits(vo.device))
    if narrow is not None:  # the kernel's rows are b's columns, its few columns the rows of a and out
        a, b, d, config = b.t(), a.t(), d.t(), narrow
    transposed = is_col_major(vo)
    if transposed:  # the kernel's rows are the user's columns
        a, b, d = b.t(), a.t(), d.t()
        arrays = {_SWAPPED.get(n, n): op.t() if op.view.ndim == 2 else op for n, op in arrays.items()}
        fusion = fusion and fusion.transposed()
    if "c" in arrays:  # C is read like the output: row-major
        c = _aligned(arrays.pop("c"), scratch, copies, row_major_only=True)
    up = arrays.pop("up", None)  # (gated: K-major and addressable, as gemm checked)
    b_scales = arrays.pop("b_block_scales", None)
    a_scales = None
    if "a_block_scales" in arrays:
        a_scales, _ = _a_block_scales(arrays.pop("a_block_scales").view, scratch, copies)
    a, b = _aligned(a, scratch, copies), _aligned(b, scratch, copies)
    target, finish = d, []
    if not tma_addressable(d.view, row_major=narrow is None):
        layout, nbytes = aligned_layout(d.view)
        d = Operand(layout, scratch.take(nbytes))
        finish.append(_Copy(d, target))
    # (a gated kernel writes both products through TMA, each clipped at N)
    products = _gated_products(arrays["aux"], scratch, finish) if up is not None and "aux" in arrays else ()
    ecfg = fusion and fusion.config(transposed)
    # Split-K slices write fp32 partial sums, so an epilogue can only run after the reduce,
    # which applies a scale-only one (alpha, row_scale, col_scale); calls with any other
    # epilogue, or the mainloop's block-wise scales or gating, do not split.
    if forced_split and fusion and not (ecfg.scale_only and not fusion.block_scaled and not fusion.gated):
        raise ValueError("split_k > 1 cannot run a fused epilogue other than alpha, row_scale and col_scale "
                         "(its K slices write partial sums, not outputs)")
    cfg = choose_config(a.view, b.view, d.view, config, debug, None if forced_split else ecfg,
                        block_scaled=bool(fusion and fusion.block_scaled), gated=bool(fusion and fusion.gated),
                        promoted=va.dtype in FP8_DTYPES and not fast_accum, sustained=sustained)
    record = DebugRecord() if debug else None
    M, N, K = d.view.shape[0], d.view.shape[1], a.view.shape[1]
    sms = device_limits(vo.device).sm_count
    # Only plain calls split on their own: the choices are fitted to them. Scaled calls split when
    # asked: promoted fp8 at M = 128 ran 0.56-0.83x the unsplit default in 2 or 4 slices
    # (bench_fp8.py --shapes 128x7168x16384 "dsv3 128x2112x7168" --accumulate promoted
    # --configs default m128-n128-s2 m128-n128-s4 m128-n256-s4 m64-n128-s2).
    auto_split = split_k is None and config is None and not fusion and not cfg.stream_k \
        and cfg.out_dtype not in FP8_DTYPES
    splits = split_count(cfg, M, N, K, sms) if auto_split else split_k or 1
    if splits > 1 and cfg.out_dtype in FP8_DTYPES:
        raise ValueError("split_k > 1 cannot write an fp8 output (its reduce writes 16- and 32-bit floats)")
    if splits > 1 and cfg.stream_k:
        raise ValueError("split_k > 1 runs without stream_k")
    if splits > 1:
        cfg = split_k_config(cfg, device_limits(vo.device).max_shared_per_block_optin)
        ld = -(-N // 4) * 4
        k_split = -(-(-(-K // cfg.block_k)) // splits)  # k-blocks per slice: ceil(ceil(K / block_k) / splits)
        place = scratch.take(splits * M * ld * 4)
        slice_view = DeviceView(0, (M, N), (ld, 1), "f32", 4, vo.device, "numba")
        gemm = _Gemm(cfg, a, b, Operand(slice_view, place), _Batch(splits, 0, 0, M * ld, k_split), scratch,
                     record=record)
        partials = Operand(DeviceView(0, (splits, M, ld), (M * ld, ld, 1), "f32", 4, vo.device, "numba"), place)
        reduce = _Reduce(partials, target, Src(VALUE_INDEX["alpha"]) if ecfg and ecfg.alpha else None,
                         arrays.get("row_scale"), arrays.get("col_scale"))
        steps = [*zeros, *copies, gemm, reduce]
    else:
        gemm = _Gemm(cfg, a, b, d, _Batch(), scratch, fusion=fusion, c=c, a_scales=a_scales, b_scales=b_scales, up=up,
                     arrays=arrays, user_srcs=user_srcs, record=record, products=products,
                     **_stream_k(cfg, M, N, K, sms))
        zero_amax = [_Memset(arrays["amax"].src, 4)] if "amax" in arrays else []
        steps = [*zero_amax, *zeros, *copies, gemm, *finish]
    return Plan(vo.device, steps, scratch, record)


def gemm_sum_plan(pairs, vo, config, debug):
    """The plan of ``out = a_0 @ b_0 + a_1 @ b_1 + ...`` for checked 16-bit views ``pairs`` (each
    K_i > 0) and ``vo``: one launch of the K-segmented kernel (``GemmConfig.k_segments``), its
    tile chosen as for one product of the summed K. Pair 0's addresses are the call's A and B
    values, pair i's the others of :func:`pair_values`. A column-major ``out`` is
    computed as ``out.T = b_0.T @ a_0.T + ...``. One major serves every pair's A and every B:
    operands TMA cannot read in it go through aligned row-major copies (as do those TMA cannot
    address), as does an ``out`` it cannot write. ``config``: as :func:`gemm_plan`'s.
    """
    sustained = config == SUSTAINED
    ops = [(Operand(a, Src(pair_values(i)[0])), Operand(b, Src(pair_values(i)[1]))) for i, (a, b) in enumerate(pairs)]
    d = Operand(vo, Src(OUT))
    if is_col_major(vo):
        ops, d = [(b.t(), a.t()) for a, b in ops], d.t()
    scratch, copies = _Scratch(), []
    a_ops, b_ops = _one_major([a for a, _ in ops], scratch, copies), _one_major([b for _, b in ops], scratch, copies)
    target, finish = d, []
    if not tma_addressable(d.view, row_major=True):
        layout, nbytes = aligned_layout(d.view)
        d = Operand(layout, scratch.take(nbytes))
        finish.append(_Copy(d, target))
    (M, N), K = d.view.shape, sum(a.view.shape[1] for a in a_ops)
    a0, b0 = a_ops[0].view, b_ops[0].view
    # the summed product as the heuristic sees it: (M, K) and (K, N), aligned, in the pairs' majors
    pad = 16 // a0.itemsize
    va = dataclasses.replace(a0, shape=(M, K), strides=(-(-K // pad) * pad, 1) if tma_addressable(a0, True)
                             else (1, -(-M // pad) * pad))
    vb = dataclasses.replace(b0, shape=(K, N), strides=(-(-N // pad) * pad, 1) if tma_addressable(b0, True)
                             else (1, -(-K // pad) * pad))
    cfg = choose_config(va, vb, d.view, None if sustained else config, debug, sustained=sustained)
    cfg = dataclasses.replace(cfg, k_segments=len(ops))
    record = DebugRecord() if debug else None
    gemm = _Gemm(cfg, a_ops[0], b_ops[0], d, _Batch(), scratch, record=record,
                 segments=tuple(zip(a_ops[1:], b_ops[1:])))
    return Plan(vo.device, [*copies, gemm, *finish], scratch, record)


def glu_backward_plan(va, vb, vo, gate, up, d_up, activation, config, debug):
    """The plan of a GLU backward (``gemm_glu_backward``) for checked views: ``dh = a @ b`` in
    one launch whose epilogue reads ``gate`` and ``up`` (values ``USER``, ``USER + 1``) and writes
    ``out`` and ``d_up`` (``USER + 2``), all four row-major and TMA-addressable (the call
    checked); ``a`` and ``b`` in either major, through aligned copies where TMA cannot address
    them; K == 0 runs the kernel on zeros. ``config``: as :func:`gemm_plan`'s; a
    :class:`GemmConfig`'s epilogue becomes the GLU's."""
    sustained = config == SUSTAINED
    ecfg = EpilogueConfig(glu=activation)
    scratch, copies = _Scratch(), []
    if va.shape[1] == 0:  # dh = 0: the kernel on a zero k-block
        a, b, copies = _zero_k_block(va, vb, scratch)
    else:
        a = _aligned(Operand(va, Src(A)), scratch, copies)
        b = _aligned(Operand(vb, Src(B)), scratch, copies)
    if isinstance(config, GemmConfig):
        config = dataclasses.replace(config, epilogue=ecfg)
    cfg = choose_config(a.view, b.view, vo, None if sustained else config, debug, ecfg, sustained=sustained)
    record = DebugRecord() if debug else None
    gemm = _Gemm(cfg, a, b, Operand(vo, Src(OUT)), _Batch(), scratch, c=Operand(gate, Src(USER)), record=record,
                 glu=(Operand(up, Src(USER + 1)), Operand(d_up, Src(USER + 2))))
    return Plan(vo.device, [*copies, gemm], scratch, record)


def _gated_products(aux, scratch, finish):
    """A gated product's ``aux`` (M, 2N) as the two (M, N) products its kernel writes: its halves,
    or aligned scratch copied into those (added to ``finish``) where TMA cannot write one."""
    M, N = aux.view.shape[0], aux.view.shape[1] // 2
    half = dataclasses.replace(aux.view, shape=(M, N))
    second = aux.view.ptr + N * aux.view.byte_strides[1]
    halves = (Operand(half, aux.src), Operand(dataclasses.replace(half, ptr=second),
                                              Src(aux.src.index, aux.src.offset + second - aux.view.ptr)))
    products = []
    for product in halves:
        if not tma_addressable(product.view, row_major=True):
            layout, nbytes = aligned_layout(product.view)
            staged = Operand(layout, scratch.take(nbytes))
            finish.append(_Copy(staged, product))
            product = staged
        products.append(product)
    return tuple(products)


def _one_major(ops, scratch, copies):
    """``ops`` as TMA reads them in one major: themselves where they share one, else each not
    row-major through an aligned row-major copy (added to ``copies``)."""
    ops = [_aligned(op, scratch, copies) for op in ops]
    if len({tma_addressable(op.view, True) for op in ops}) == 1:
        return ops
    return [_aligned(op, scratch, copies, row_major_only=True) for op in ops]


def _zero_k_block(va, vb, scratch):
    """``(a, b, [memset])`` for a product with K == 0: zeros shaped like its operands with one
    k-block of K, K-major (as every kernel reads them), in scratch that the memset clears on the
    stream before the kernel, which then computes its epilogue of a zero product
    ((M + N) x 128 bytes of scratch)."""
    M, N, k = va.shape[0], vb.shape[1], KBLOCK_BYTES // va.itemsize
    place = scratch.take((M + N) * KBLOCK_BYTES)
    a = Operand(DeviceView(0, (M, k), (k, 1), va.dtype, va.itemsize, va.device, va.framework), place)
    b = Operand(DeviceView(0, (k, N), (1, k), vb.dtype, vb.itemsize, vb.device, vb.framework),
                Src(SCRATCH, place.offset + M * KBLOCK_BYTES))
    return a, b, [_Memset(place, (M + N) * KBLOCK_BYTES)]


def _a_block_scales(view, scratch, copies):
    """A's block-wise scales as the kernel's TMA reads them: ``(operand, batch stride)`` of
    (K blocks, M) matrices with M contiguous (torch's layout of (M, K blocks)), from a 2-D
    (M, K blocks) view or, masked groups, a 3-D (G, M, K blocks) one. Other layouts are
    copied into aligned scratch first (one more kernel per call)."""
    src = Src(VALUE_INDEX["a_block_scales"])
    if view.ndim == 2:
        return _aligned(Operand(transpose(view), src), scratch, copies, row_major_only=True), 0
    G, M, KB = view.shape
    sg, sm, sk = view.strides
    per_group = dataclasses.replace(view, shape=(KB, M), strides=(sk, sm))
    if tma_addressable(per_group, row_major=True) and (sg * view.itemsize) % 16 == 0:
        return Operand(per_group, src), sg
    if sg == M * sm and (M * view.itemsize) % 16 == 0:  # the groups' rows merge into one M-major copy
        merged = dataclasses.replace(view, shape=(G * M, KB), strides=(sm, sk))
        copy = _aligned(Operand(transpose(merged), src), scratch, copies, row_major_only=True)
        return Operand(dataclasses.replace(copy.view, shape=(KB, M)), copy.src), M
    raise LayoutError(f"scale_a of shape {tuple(view.shape)} with strides {tuple(view.strides)}: masked groups "
                      "need each group's scales M-major (strides (*, 1, M)) or the groups' rows contiguous, and M a "
                      "multiple of 4")


def split_k_config(cfg, shared_limit):
    """The kernel of ``cfg``'s K slices: fp32 partial sums (no epilogue: the reduce applies a
    scale-only one), and the deepest ring that fits ``shared_limit`` bytes with their wider
    output buffers."""
    return dataclasses.replace(cfg, out_dtype="f32", epilogue=None, stages=max_stages(
        cfg.in_dtype, "f32", cfg.block_n, shared_limit, a_major=cfg.a_major, b_major=cfg.b_major,
        block_m=cfg.block_m))


def _user_sources(user_args):
    """The sources of the user epilogue's arguments: arrays are the call's USER + i values."""
    srcs, arrays = [], 0
    for x in user_args:
        srcs.append(Src(USER + arrays) if is_array(x) else None)
        arrays += is_array(x)
    return tuple(srcs)


def _stream_k(cfg, M, N, K, sms):
    if not cfg.stream_k:
        return {}
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    k_blocks = -(-K // cfg.block_k)
    grid, dp_tiles = stream_k_schedule(tiles, k_blocks, sms)
    if (tiles - dp_tiles) * k_blocks * grid >= 2**32:  # the kernel's run bounds are 32-bit
        raise ValueError(f"stream_k: {tiles} tiles of {k_blocks} k-blocks are too many for its 32-bit index math")
    return {"grid": grid, "dp_tiles": dp_tiles}


def bmm_plan(ma, mb, mo, batch, strides, config):
    """The plan of ``out[i] = a[i] @ b[i]`` for ``batch`` items: 2-D views of item 0 and the
    batch strides ``(a, b, out)`` in elements (0: one matrix for every item).

    As :func:`gemm_plan`: a column-major ``out`` is computed as ``out.T = b.T @ a.T``; operands
    TMA cannot address (a leading dimension or batch stride that is not a multiple of 16
    bytes, a misaligned base, any other strides) are copied into aligned scratch, the whole
    batch in one launch, and an ``out`` it cannot write receives the result from such a copy.
    """
    a, b, d = Operand(ma, Src(A)), Operand(mb, Src(B)), Operand(mo, Src(OUT))
    sa, sb, so = strides
    if is_col_major(mo):
        a, b, d, sa, sb = b.t(), a.t(), d.t(), sb, sa
    scratch, copies = _Scratch(), []
    a, sa = _aligned_batch(a, batch, sa, scratch, copies)
    b, sb = _aligned_batch(b, batch, sb, scratch, copies)
    target, target_stride, finish = d, so, []
    d, so = _aligned_batch(d, batch, so, scratch, [], row_major_only=True)  # (without its copy in)
    if d is not target:  # computed into aligned scratch, then copied out
        finish.append(_Copy(_stacked(d, batch, so), _stacked(target, batch, target_stride)))
    cfg = choose_config(a.view, b.view, d.view, config, debug=False, units=batch)
    gemm = _Gemm(cfg, a, b, d, _Batch(batch, sa, sb, so), scratch)
    return Plan(mo.device, [*copies, gemm, *finish], scratch)


def grouped_plan(mode, ma, mb, mo, groups, strides, row_scale, activation, config, debug, alpha=False,
                 block_scales=None, fast_accum=False):
    """The plan of a grouped GEMM (``numba_hopper.matmul.grouped``): ``groups`` products over the
    2-D views of item 0 of each operand and their batch strides ``(a, b, out)`` in elements.

    Contiguous: ``ma`` and ``mo`` are the whole (rows, K) and (rows, N) matrices (strides 0:
    one matrix, row coordinates global); masked: the (M, K) and (M, N) matrices of group 0.
    ``row_scale``: a 1-D f32 view (rows, or G * M for masked) or None; ``alpha``: whether
    the call's alpha value multiplies the output; ``block_scales``: fp8 block-wise ``(scale_a,
    scale_b)`` f32 views (A's (rows, K/128), or (G, M, K/128) masked; B's (G, K/128, N/128)),
    or None; ``fast_accum``: fp8 products without block-wise scales accumulate in the tensor
    cores throughout, not promoted every 128 K. The launch takes the persistent grid: min(SMs,
    the host's bound on the tiles), whatever the sizes are.
    """
    ecfg = None
    if row_scale is not None or activation is not None or alpha:
        ecfg = EpilogueConfig(alpha=alpha, row_scale=row_scale is not None, activation=activation)
    cfg = grouped_config(ma, mb, mo, mode, groups, config, debug, ecfg, block_scaled=block_scales is not None,
                         promoted=ma.dtype in FP8_DTYPES and not fast_accum)
    M, N = mo.shape
    tiles_m = -(-M // cfg.block_m)
    bound = (groups * tiles_m if mode == "masked" else tiles_m + groups) * -(-N // cfg.block_n)
    if bound >= GROUP_WALK_END:
        raise ValueError(f"grouped GEMM: up to {bound} tiles, more than its 31-bit tile ids can number")
    grid = min(bound, device_limits(mo.device).sm_count)
    scratch, copies = _Scratch(), []
    record = DebugRecord() if debug else None
    arrays = {"row_scale": Operand(row_scale, Src(VALUE_INDEX["row_scale"]))} if row_scale is not None else {}
    a_scales, a_scales_stride, b_scales = None, 0, None
    if block_scales is not None:
        a_scales, a_scales_stride = _a_block_scales(block_scales[0], scratch, copies)
        b_scales = Operand(block_scales[1], Src(VALUE_INDEX["b_block_scales"]))
    gemm = _Gemm(cfg, Operand(ma, Src(A)), Operand(mb, Src(B)), Operand(mo, Src(OUT)),
                 _Batch(groups, *strides, a_scales=a_scales_stride), scratch, a_scales=a_scales, b_scales=b_scales,
                 arrays=arrays, grid=grid, record=record, group_rows=Src(GROUP_ROWS))
    return Plan(mo.device, [*copies, gemm], scratch, record)


def zero_fill_plan(vo, count=1, stride=0):
    """``out[...] = 0`` (K == 0, no epilogue) for ``count`` matrices like the 2-D view ``vo``,
    ``stride`` elements apart: memsets of the rows of a row- or column-major ``out`` (one for a
    batch whose rows are evenly spaced), else zeros copied in from scratch (a memset and one
    copy launch)."""
    if not (is_row_major(vo) or is_row_major(transpose(vo))):
        scratch = _Scratch()
        layout, nbytes = aligned_layout(vo)
        zeros = Operand(layout, scratch.take(nbytes))
        copy = _Copy(_stacked(zeros, count, 0), _stacked(Operand(vo, Src(OUT)), count, stride))
        return Plan(vo.device, [_Memset(zeros.src, nbytes), copy], scratch)
    w = vo if is_row_major(vo) else transpose(vo)
    (rows, cols), size = w.shape, vo.itemsize
    pitch = (leading_dim(w) if rows > 1 else stride) * size
    if count > 1 and stride * size == rows * pitch and pitch >= cols * size:  # one memset for the batch
        rows, count = rows * count, 1
    return Plan(vo.device, [_Memset(Src(OUT, i * stride * size), cols * size, rows, pitch) for i in range(count)])
