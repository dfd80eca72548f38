"""``numba_hopper.grouped_gemm``: many GEMMs of one shape family in one launch (mixture-of-experts layers).

Group g multiplies its rows of ``a`` by its own matrix ``b[g]``. The group sizes stay on the
device: the kernel's tile scheduler reads them (``kernels/scheduler.py``), so a call never
waits for the GPU and a CUDA graph replays correctly when the sizes change between replays.

Two layouts, as PyTorch and DeepGEMM name them:

- contiguous (``offsets``, ``torch._grouped_mm``'s ``offs``): ``a`` is (rows, K), the groups'
  rows one after another; ``offsets[g]`` is the end of group g (group g is rows
  ``offsets[g-1]:offsets[g]``, ``offsets[-1] = 0``); ``out`` is (rows, N).
- masked (``masked_m``, DeepGEMM's masked layout for decoding): ``a`` is (G, M, K) and
  ``out`` (G, M, N); only the first ``masked_m[g]`` rows of group g are computed.

FP8 groups (e4m3/e5m2) take DeepSeek-V3's block-wise scales: each tile's mainloop reads
B's scales at its group (and a masked A's at its group and row; a contiguous A's rows are
global), ``numba_hopper.kernels.mainloop.promoted``.

The call path is ``gemm``'s: a plan per layout in the same cache (:mod:`.plan_cache`),
addresses patched into the prepared launch, no descriptor encode and no synchronization per call.
"""

from __future__ import annotations

from numbers import Real

from ..runtime import debug as _debug
from ..runtime.arrays import ITEMSIZE, DeviceView, byte_span, device_view, is_row_major, tma_addressable, transpose
from .checks import (FP8_DTYPES, check_dtype, check_out, check_out_dtype, check_strides, default_out_dtype,
                      overlap_pairs)
from ..runtime.operands import describe
from .plan import A, B, GROUP_ROWS, OUT, VALUE_INDEX, Plan, grouped_plan, values_packer
from .plan_cache import first_run, plans, run
from ..errors import DeviceMismatchError, DtypeError, LayoutError, ShapeError
from ..kernels.epilogue_config import ACTIVATIONS
from ..kernels.gemm_config import KBLOCK_SCALE

# A grouped call's values after (scratch, a, b, out): alpha, the row scale and the block
# scales (the only operands it takes), then the group sizes.
_values = values_packer(("alpha", "row_scale", "a_block_scales", "b_block_scales"), extra=("group_sizes",))

__all__ = ["grouped_gemm", "check_group_sizes"]

GROUPED_INPUT_DTYPES = ("bf16", "f16", *FP8_DTYPES)


def grouped_gemm(a, b, offsets=None, *, masked_m=None, out=None, out_dtype=None, row_scale=None, activation=None,
                 scale_a=None, scale_b=None, use_fast_accum=False, dtype=None, stream=None, config=None, debug=None):
    """Grouped ``out[rows of g] = act(row_scale * (a[rows of g] @ b[g]))`` for every group g, in one launch.

    Contiguous (``offsets``): ``a`` (rows, K) row-major, ``b`` (G, K, N) with each ``b[g]``
    row-major or column-major (a (G, N, K) tensor's ``.transpose(1, 2)``, as
    ``torch._grouped_mm``'s ``mat_b``), ``offsets`` an int32 device vector of the G
    cumulative group ends. Returns (rows, N); rows at or after ``offsets[-1]`` are not
    written (uninitialized in a new output). Any group size works, 0 included.

    Masked (``masked_m=``, instead of ``offsets``): ``a`` (G, M, K), ``b`` as above, an int32
    device vector ``masked_m`` of G row counts; returns (G, M, N), whose rows at or after
    ``masked_m[g]`` in group g are not written.

    Preconditions, not checked (a check would wait for the GPU): ``offsets`` non-decreasing,
    ``0 <= offsets[g] <= rows``; ``0 <= masked_m[g] <= M``. Sizes that break them cannot
    make the kernel read or write outside ``a``, ``b`` and ``out`` (every bound is clamped)
    but give wrong results. ``debug=True`` (or ``NUMBA_HOPPER_DEBUG=1``) synchronizes, checks
    them and raises ``ValueError``, and runs the debug build (see ``gemm``).

    Fused: ``row_scale`` float32, one value per row of ``a`` (contiguous: (rows,); masked:
    (G, M)), e.g. the router's weights; ``activation`` one of ``gemm``'s (applied after the
    scale). ``out_dtype``: "bf16", "f16" or "f32" (default the input's; bf16 for fp8).

    FP8 (``a`` and ``b`` both ``float8_e4m3fn`` or both ``float8_e5m2``; numba/CuPy: uint8
    with ``dtype="e4m3"``/``"e5m2"``), accumulated in float32:

    - layout: fp8 wgmma reads K-major operands only: ``a`` row-major, and each ``b[g]``
      column-major, i.e. ``b`` is ``w.transpose(1, 2)`` of a contiguous (G, N, K) weight
      ``w`` (the usual expert-weight layout); K a multiple of 16. Anything else raises
      ``LayoutError``; fp8 operands are never copied.
    - ``scale_a``, ``scale_b``, block-wise (DeepSeek-V3's recipe, as ``gemm``'s): float32,
      any strides (``torch._scaled_mm``'s column-major ones included). Contiguous:
      ``scale_a`` (rows, ceil(K / 128)), one per row of ``a`` and 128 K; masked: (G, M,
      ceil(K / 128)). ``scale_b`` (G, ceil(K / 128), ceil(N / 128)): one per 128 x 128 block
      of each ``b[g]`` (K, N). Each 128-deep k-block's product is scaled and added to an f32
      sum (tiles at most 128 wide by default; 192-wide ones, not yet measured here, as an
      opt-in ``config``); the accuracy is ``gemm``'s block-wise one.
    - per-tensor: Python numbers, multiplied into the output (any input dtype).
    - accumulation: as ``gemm``'s, each 128-deep k-block's sum is added into an f32 register
      sum (promoted, ``torch._scaled_grouped_mm``'s default); ``use_fast_accum=True``
      accumulates products without block-wise scales in the tensor cores throughout.
    - not supported: row-wise and one-element device-array scales, a number beside a
      block-wise array, mixed e4m3 x e5m2 and fp8 outputs.

    Layouts: inputs bf16 or fp16 (both the same), or fp8 as above; ``a`` and ``out``
    C-contiguous rows (``out`` wholly contiguous); every matrix TMA-addressable
    (16-byte-aligned base, batch stride and leading dimension); N * out's item size and K
    bytes a multiple of 16. No operand is copied. ``dtype``, ``stream``, ``config`` as for
    ``gemm`` (``config``: the tile and ring; grouped kernels take no cluster, split-K or
    stream-K).

    Raises before launch (``numba_hopper.errors``): ``DtypeError`` (dtypes, block-wise
    scales with 16-bit inputs or not float32, ``offsets``/``masked_m`` not int32),
    ``ShapeError`` (shapes, group counts, K, scale shapes), ``LayoutError``,
    ``DeviceMismatchError``, ``OverlapError``, ``UnsupportedDeviceError``; host arrays
    raise TypeError.
    """
    if debug is None:
        debug = _debug.DEFAULT
    if not isinstance(use_fast_accum, bool):
        raise TypeError(f"use_fast_accum must be a bool, got {use_fast_accum!r}")
    if (offsets is None) == (masked_m is None):
        raise ValueError("grouped_gemm takes exactly one of offsets (contiguous groups) and masked_m (masked groups)")
    masked = offsets is None
    sizes = masked_m if masked else offsets
    sig_a, pa = describe(a)
    sig_b, pb = describe(b)
    sig_s, ps = describe(sizes)
    sig_o, po = describe(out) if out is not None else (None, 0)
    sig_r, pr = describe(row_scale) if row_scale is not None else (None, 0)
    if scale_a is None and scale_b is None:
        alpha, sig_sa, psa, sig_sb, psb = 1.0, None, 0, None, 0
    else:
        (sig_sa, fa, psa), (sig_sb, fb, psb) = _scale_arg(scale_a), _scale_arg(scale_b)
        alpha = fa * fb
    values = _values(alpha, pr, psa, psb, ps)
    key = ("grouped", masked, sig_a, sig_b, sig_s, sig_o, sig_r, sig_sa, sig_sb, alpha != 1.0, activation, out_dtype,
           dtype, config, use_fast_accum)
    entry = None if debug else plans.get(key)
    if entry is None:
        return _first_grouped(key, masked, a, b, sizes, out, out_dtype, row_scale, activation, (scale_a, scale_b),
                              dtype, stream, config, debug, values, alpha != 1.0, use_fast_accum)
    return run(entry, out, pa, pb, po, values, stream)


def _scale_arg(x):
    """``(signature, factor, address)`` of a scale keyword: None, a number (a factor of the
    output), or a device array (checked on a layout's first call)."""
    if x is None:
        return None, 1.0, 0
    if isinstance(x, Real):
        return "number", float(x), 0
    sig, ptr = describe(x)
    return sig, 1.0, ptr


def _first_grouped(key, masked, a, b, sizes, out, out_dtype, row_scale, activation, scales, dtype, stream, config,
                   debug, values, alpha, fast_accum):
    """A call with a new layout: check everything, build its plan, run it, keep it (``alpha``:
    whether the call's alpha value multiplies the output)."""
    name = "masked_m" if masked else "offsets"
    va, vb, vs = device_view(a, dtype=dtype), device_view(b, dtype=dtype), device_view(sizes)
    G = _check_sizes(name, vs)
    if len(va.shape) != (3 if masked else 2):
        raise ShapeError(f"a must be {'(G, M, K)' if masked else '(rows, K)'} with {name}, got shape {va.shape}")
    if len(vb.shape) != 3:
        raise ShapeError(f"b must be (G, K, N), got shape {vb.shape}")
    check_dtype("a.dtype", va.dtype, GROUPED_INPUT_DTYPES)
    if vb.dtype != va.dtype:
        mixed = " (mixed e4m3 x e5m2 is not supported)" if {va.dtype, vb.dtype} == set(FP8_DTYPES) else ""
        raise DtypeError(f"a and b must have the same dtype{mixed}; got {va.dtype} and {vb.dtype}")
    if vb.shape[0] != G or (masked and va.shape[0] != G):
        what = f"a has {va.shape[0]} groups, b {vb.shape[0]}" if masked else f"b has {vb.shape[0]} groups"
        raise ShapeError(f"{what}, {name} {G}: they must agree")
    K, N = va.shape[-1], vb.shape[2]
    if vb.shape[1] != K:
        raise ShapeError(f"K mismatch: a is {va.shape}, b is {vb.shape} (a.shape[-1] must equal b.shape[1])")
    if K == 0:
        raise ShapeError("grouped_gemm needs K > 0")
    for other, v in (("b", vb), (name, vs)):
        if v.device != va.device:
            raise DeviceMismatchError(f"{other} is on device {v.device}, a on device {va.device}")
    rows = va.shape[-2]
    shape = (G, rows, N) if masked else (rows, N)
    block_scales = _block_scales(scales, va, masked, G, rows, N, K)
    vo = None
    if out is None:
        check_out_dtype("out_dtype", out_dtype or default_out_dtype(va.dtype))
    else:
        vo = device_view(out, dtype=out_dtype)
        check_out(vo, shape, va.device, out_dtype)
        if not _contiguous(vo) or vo.ptr % 16:
            raise LayoutError(f"out must be C-contiguous (strides {_contiguous_strides(shape)}) at a 16-byte-aligned "
                              f"address, got strides {vo.strides} at {vo.ptr:#x}")
    vr = None
    if row_scale is not None:
        vr = device_view(row_scale)
        check_dtype("row_scale.dtype", vr.dtype, ("f32",))
        if tuple(vr.shape) != shape[:-1]:
            raise ShapeError(f"row_scale has shape {tuple(vr.shape)}, expected {shape[:-1]} (one value per row of a)")
        if vr.device != va.device:
            raise DeviceMismatchError(f"row_scale is on device {vr.device}, a on device {va.device}")
        if not _contiguous(vr):
            raise LayoutError(f"row_scale must be contiguous, got strides {vr.strides}")
    if activation not in (None,) + ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {ACTIVATIONS}; got {activation!r}")
    ma, mb, sa, sb = _matrices(va, vb, masked)
    if debug:
        _check_sizes_on_device(name, vs, rows)

    out_type = vo.dtype if vo else out_dtype or default_out_dtype(va.dtype)
    if out_type in FP8_DTYPES:
        raise DtypeError(f"grouped_gemm writes bf16, f16 or f32 outputs, not {out_type} (gemm writes fp8)")
    out_bytes = ITEMSIZE[out_type]
    if (N * out_bytes) % 16:  # (the rows of a tile that ends inside it: kernels.epilogue)
        raise LayoutError(f"grouped_gemm stores whole 16-byte chunks of output rows: N * {out_bytes} bytes must be "
                          f"a multiple of 16 (N = {N})")

    def plan_for(vo):
        if 0 in vo.shape or G == 0:
            return Plan(vo.device, [])
        mo = DeviceView(vo.ptr, (rows, N), (N, 1), vo.dtype, vo.itemsize, vo.device, vo.framework)
        flat = None if vr is None else DeviceView(vr.ptr, (G * rows if masked else rows,), (1,), "f32", 4, vr.device,
                                                   vr.framework)
        strides = (sa, sb, rows * N) if masked else (0, sb, 0)
        return grouped_plan("masked" if masked else "contiguous", ma, mb, mo, G, strides, flat, activation, config,
                            debug, alpha=alpha, block_scales=block_scales, fast_accum=fast_accum)

    read = [("a", A, va), ("b", B, vb), (name, GROUP_ROWS, vs)] + \
        ([("row_scale", VALUE_INDEX["row_scale"], vr)] if vr else [])
    if block_scales:
        read += [("scale_a", VALUE_INDEX["a_block_scales"], block_scales[0]),
                 ("scale_b", VALUE_INDEX["b_block_scales"], block_scales[1])]
    written = [("out", OUT, vo)] if vo else []
    spans = lambda arrays: tuple((n, i, byte_span(v)) for n, i, v in arrays)  # noqa: E731
    return first_run(key, plan_for, a, out, vo, shape, out_dtype, va, (va.ptr, vb.ptr), values, stream,
                     overlap_pairs(spans(written), spans(read)), cache=not debug)


def _block_scales(scales, va, masked, G, rows, N, K):
    """The block-wise ``(scale_a, scale_b)`` views, checked, or None when the scales are
    numbers or absent."""
    if all(x is None or isinstance(x, Real) for x in scales):
        return None
    if va.dtype not in FP8_DTYPES:
        raise DtypeError(f"block-wise scales are for fp8 operands; a and b are {va.dtype}")
    kb, nb = -(-K // KBLOCK_SCALE), -(-N // KBLOCK_SCALE)
    a_shape = (G, rows, kb) if masked else (rows, kb)
    b_shape = (G, kb, nb)
    views = []
    for name, x, shape in (("scale_a", scales[0], a_shape), ("scale_b", scales[1], b_shape)):
        v = None if x is None or isinstance(x, Real) else device_view(x)
        got = "none" if x is None else "a number" if v is None else f"shape {tuple(v.shape)}"
        if got != f"shape {shape}":
            raise ShapeError(f"grouped fp8 scales given as arrays are block-wise: scale_a of shape {a_shape} (one per "
                             f"row of a and 128 K) with scale_b of shape {b_shape} (one per 128 x 128 block of each "
                             f"b[g]); {name} has {got} (per-tensor scales: Python numbers; row-wise and "
                             f"one-element array scales are not supported)")
        check_dtype(f"{name}.dtype", v.dtype, ("f32",))
        if v.device != va.device:
            raise DeviceMismatchError(f"{name} is on device {v.device}, a on device {va.device}")
        check_strides(name, v)
        views.append(v)
    return tuple(views)


def _check_sizes(name, vs):
    if len(vs.shape) != 1:
        raise ShapeError(f"{name} must be a vector of one int32 per group, got shape {vs.shape}")
    if vs.dtype != "i32":
        raise DtypeError(f"{name} must be int32 (as torch._grouped_mm's offs), got {vs.dtype}")
    if vs.shape[0] > 1 and vs.strides[0] != 1:
        raise LayoutError(f"{name} must be contiguous, got stride {vs.strides[0]}")
    return vs.shape[0]


def _matrices(va, vb, masked):
    """``(a, b, a's batch stride, b's batch stride)``: the 2-D matrices of group 0, checked
    for TMA (``a`` row-major, each ``b[g]`` row- or column-major; column-major for fp8)."""
    ma = DeviceView(va.ptr, va.shape[-2:], va.strides[-2:], va.dtype, va.itemsize, va.device, va.framework)
    mb = DeviceView(vb.ptr, vb.shape[1:], vb.strides[1:], vb.dtype, vb.itemsize, vb.device, vb.framework)
    sa = va.strides[0] if masked else 0
    sb = vb.strides[0]
    if not (is_row_major(ma) and tma_addressable(ma, True)) or (sa * va.itemsize) % 16:
        raise LayoutError(f"a must hold row-major (rows, K) matrices with a 16-byte-aligned base, row pitch and "
                          f"batch stride; got strides {va.strides} (elements) at {va.ptr:#x}")
    if va.dtype in FP8_DTYPES and not is_row_major(transpose(mb)):  # fp8 wgmma has no transpose
        raise LayoutError(f"fp8 operands must be K-major: each b[g] must be column-major (K, N), got b's strides "
                          f"{vb.strides}; pass b as w.transpose(1, 2) of a contiguous (G, N, K) weight w (or "
                          f"b.transpose(1, 2).contiguous().transpose(1, 2))")
    if not (tma_addressable(mb, True) or tma_addressable(mb, False)) or (sb * vb.itemsize) % 16 or (
            vb.shape[0] > 1 and sb < _extent(mb)):
        raise LayoutError(f"b must hold G row- or column-major (K, N) matrices (b[g] or a (G, N, K) tensor's "
                          f".transpose(1, 2)) with 16-byte-aligned base, leading dimension and batch stride; got "
                          f"strides {vb.strides} (elements) at {vb.ptr:#x}")
    return ma, mb, sa, sb


def _extent(m):
    """Elements one matrix spans (its batch stride must be at least that: no overlap)."""
    w = m if is_row_major(m) else transpose(m)
    return (w.shape[0] - 1) * w.strides[0] + w.shape[1]


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _contiguous(v):
    return all(s == c for s, c, n in zip(v.strides, _contiguous_strides(v.shape), v.shape) if n > 1)


def _check_sizes_on_device(name, vs, rows):
    """(Debug mode) wait for the device, read the sizes and check the preconditions."""
    from numba import cuda

    cuda.synchronize()
    cai = {"shape": tuple(vs.shape), "strides": vs.byte_strides, "typestr": "<i4", "data": (vs.ptr, False),
           "version": 3}
    host = cuda.from_cuda_array_interface(cai, owner=None, sync=False).copy_to_host()
    check_group_sizes(name, host, rows)


def check_group_sizes(name, sizes, rows):
    """Raise ValueError unless the host copy ``sizes`` of ``offsets`` (non-decreasing, in
    ``[0, rows]``) or ``masked_m`` (each in ``[0, rows]``) meets grouped_gemm's preconditions."""
    import numpy as np

    host = np.asarray(sizes, dtype=np.int64)
    if name == "offsets":
        bad = np.flatnonzero(np.diff(np.concatenate(([0], host))) < 0)
        if bad.size:
            g = int(bad[0])
            raise ValueError(f"offsets must be non-decreasing from 0: offsets[{g}] = {host[g]} is below "
                             f"{host[g - 1] if g else 0}")
        if host.size and host[-1] > rows:
            raise ValueError(f"offsets[-1] = {host[-1]} is past the {rows} rows of a")
    else:
        bad = np.flatnonzero((host < 0) | (host > rows))
        if bad.size:
            g = int(bad[0])
            raise ValueError(f"masked_m[{g}] = {host[g]} is outside [0, {rows}] (M)")
