"""The checks a GEMM call passes before anything is launched, each raising a specific
``numba_hopper.errors`` exception. They read :class:`~numba_hopper.runtime.arrays.DeviceView`s only."""

from __future__ import annotations

from ..runtime.arrays import DeviceView, is_row_major, merge_rows, tma_addressable, transpose
from ..errors import DeviceMismatchError, DtypeError, LayoutError, OverlapError, ShapeError

__all__ = ["INPUT_DTYPES", "EPILOGUE_DTYPES", "OUTPUT_DTYPES", "FP8_DTYPES", "default_out_dtype", "check_out_dtype", "check_dtype", "check_fp8_operands", "check_strides", "check_inputs", "check_out",
           "rows_of",
           "overlap_pairs", "check_overlaps"]

FP8_DTYPES = ("e4m3", "e5m2")
INPUT_DTYPES = ("bf16", "f16", *FP8_DTYPES)
EPILOGUE_DTYPES = ("bf16", "f16", "f32")  # of the fused epilogue's arrays (c, bias, aux_out)
OUTPUT_DTYPES = EPILOGUE_DTYPES + FP8_DTYPES


def default_out_dtype(in_dtype):
    """The output dtype of a call that names none: the input's, bf16 for fp8 inputs (as
    ``torch._scaled_mm``)."""
    return "bf16" if in_dtype in FP8_DTYPES else in_dtype


def check_out_dtype(what, dt):
    """Raise DtypeError unless ``dt`` is an output dtype (uint8 names the fp8 ``out_dtype``s)."""
    if dt == "u8":
        raise DtypeError(f"{what} is uint8: for an fp8 output pass out_dtype='e4m3' or 'e5m2'")
    check_dtype(what, dt, OUTPUT_DTYPES)


def check_dtype(what, dt, allowed):
    """Raise DtypeError, naming ``what``, unless ``dt`` is in ``allowed``."""
    if dt not in allowed:
        raise DtypeError(f"{what} must be one of {allowed}; got {dt!r}")


def check_strides(name, v: DeviceView):
    """Raise LayoutError if ``v`` has a negative stride."""
    # Negative strides (flipped views) are refused rather than copied: a silent copy would
    # hide a likely mistake.
    if any(s < 0 for s in v.strides):
        raise LayoutError(f"{name} has negative strides {v.strides}; pass a copy (e.g. .contiguous())")


def rows_of(name, v: DeviceView):
    """``v`` of shape ``(..., n)`` as the (rows, n) matrix it is (``merge_rows``): how a call
    whose ``a`` has more than two dimensions reads it, its output, ``c`` and ``aux_out``."""
    if v.ndim < 2:
        raise ShapeError(f"{name} must be 2-D (or more: its leading dimensions are rows), got shape {v.shape}")
    m = merge_rows(v)
    if m is None:
        raise LayoutError(f"{name} of shape {v.shape} and strides {v.strides}: its leading dimensions "
                          f"{v.shape[:-1]} do not merge into one row stride; pass {name}.reshape(-1, {v.shape[-1]})")
    return m


def check_inputs(va: DeviceView, vb: DeviceView, a_shape=None):
    """``a_shape``: ``a``'s own shape, when ``va`` merged its leading dimensions (``rows_of``)."""
    for name, v in (("a", va), ("b", vb)):
        if len(v.shape) != 2:
            raise ShapeError(f"{name} must be 2-D, got shape {v.shape}")
        check_dtype(f"{name}.dtype", v.dtype, INPUT_DTYPES)
        check_strides(name, v)
    if va.dtype != vb.dtype and {va.dtype, vb.dtype} != set(FP8_DTYPES):  # (e4m3 x e5m2 mixes)
        raise DtypeError(f"a and b must have the same dtype (or be e4m3 and e5m2); got {va.dtype} and {vb.dtype}")
    if va.shape[1] != vb.shape[0]:
        raise ShapeError(f"shape mismatch: a is {a_shape or va.shape}, b is {vb.shape} "
                         "(a.shape[-1] must equal b.shape[0])")
    if va.device != vb.device:
        raise DeviceMismatchError(f"a is on device {va.device} and b on device {vb.device}")


def check_fp8_operands(va: DeviceView, vb: DeviceView):
    """fp8 wgmma reads K-major operands only (it has no transpose): A row-major (M, K), B
    column-major (K, N) ("TN"), each TMA-addressable (16-byte-aligned base, K bytes a
    multiple of 16), since fp8 operands get no transposed or aligned copies. With K == 0
    nothing is read, so any layout does."""
    if va.shape[1] == 0:
        return
    if not is_row_major(va):
        raise LayoutError(f"fp8 operands must be K-major: a (strides {va.strides}) must be row-major (M, K); "
                          "pass a.contiguous()")
    if not is_row_major(transpose(vb)):
        raise LayoutError(f"fp8 operands must be K-major: b (strides {vb.strides}) must be column-major (K, N); "
                          "pass b as w.t() of a row-major (N, K) tensor w, or b.t().contiguous().t()")
    for name, v, row_major in (("a", va, True), ("b", vb, False)):
        if not tma_addressable(v, row_major):
            raise LayoutError(f"fp8 {name}: TMA needs a 16-byte-aligned base address and rows of a multiple of "
                              f"16 bytes along K (K = {va.shape[1]}, strides {v.strides}, address {v.ptr:#x}); "
                              "fp8 operands are not copied to an aligned layout")


def check_out(vo: DeviceView, shape, device, out_dtype, name="out"):
    """Raise unless ``out`` (or the array ``name``) can take the product: its shape, dtype (and
    ``out_dtype``), device, strides, and no broadcast (zero-stride) dimension."""
    if tuple(vo.shape) != shape:
        raise ShapeError(f"{name} has shape {tuple(vo.shape)}, expected {shape}")
    check_out_dtype(f"{name}.dtype", vo.dtype)
    if out_dtype is not None and out_dtype != vo.dtype:
        raise DtypeError(f"{name} has dtype {vo.dtype} but out_dtype={out_dtype!r}" if name == "out" else
                         f"{name} has dtype {vo.dtype}, the inputs {out_dtype}")
    if vo.device != device:
        raise DeviceMismatchError(f"{name} is on device {vo.device}, the inputs on device {device}")
    check_strides(name, vo)
    if 0 not in vo.shape and any(s == 0 and n > 1 for s, n in zip(vo.strides, vo.shape)):
        raise LayoutError(f"{name} has a zero stride {vo.strides} (a broadcast view): its elements alias")


def overlap_pairs(written, read, in_place=()):
    """The pairs of a call's arrays that must not share memory, for :func:`check_overlaps`.

    What a kernel writes must share no memory with anything else it reads or writes: it reads
    them while it writes. ``written``, ``read``: ``(name, value index, byte span)`` of the
    caller's arrays (the index into the call's values, where its address is); ``in_place``:
    the (written, read) name pairs allowed to be exactly the same memory (``out is c``).
    Empty arrays overlap nothing.
    """
    pairs = []
    for i, w in enumerate(written):
        for r in (*read, *written[i + 1:]):
            if w[2] and r[2]:
                pairs.append((w, r, (w[0], r[0]) in in_place))
    return tuple(pairs)


def check_overlaps(pairs, values):
    """Raise OverlapError if a pair of :func:`overlap_pairs` shares memory at these addresses
    (judged by address ranges: conservative for interleaved views)."""
    for (name, i, span), (other, j, other_span), same_allowed in pairs:
        lo, vlo = values[i], values[j]
        if lo < vlo + other_span and vlo < lo + span and not (same_allowed and lo == vlo):
            raise OverlapError(f"{name} [0x{lo:x}, 0x{lo + span:x}) overlaps {other} "
                               f"[0x{vlo:x}, 0x{vlo + other_span:x})")
