"""``numba_hopper.gemm`` and ``numba_hopper.bmm``: ``out = a @ b`` on Hopper with the warp-specialized
TMA/wgmma kernel.

Inputs are bf16 or fp16 (fp32 accumulation), outputs bf16, fp16 or fp32. fp8 inputs (e4m3,
e5m2) take the TN layout only (see ``gemm``). Each of ``a``, ``b`` and ``out`` may be
row-major or column-major (a leading dimension larger than the
extent is fine); the layouts reach the kernel through the TMA descriptors and the wgmma
transpose bits, never through copies. A column-major ``out`` is computed as
``out.T = b.T @ a.T``, which is the same kernel on swapped, transposed operands.

The fallback that copies: TMA needs 16-byte-aligned base addresses and leading dimensions
that are multiples of 16 bytes. An operand that breaks that (say a row-major bf16 matrix
with 1001 columns, or a slice starting at an odd element) is first copied into an aligned
row-major scratch region, and an ``out`` that breaks it (any odd N in bf16) receives the
result through one (``numba_hopper.matmul.extra_launches``): one more kernel per copy, and its bytes moved
twice. Layouts that TMA can read cost no copy.

Arrays: PyTorch tensors (bf16 included), CuPy arrays, numba device arrays and anything with
``__cuda_array_interface__``. numba has no bf16 dtype: hold bf16 data in ``uint16`` arrays
and pass ``dtype="bf16"`` (``out_dtype="bf16"`` then allocates a ``uint16`` result).
The result is of the caller's kind: ``out`` if given, else a new array like ``a``.

Fused epilogues (``alpha``, ``beta``/``c``, ``bias``, ``activation``, ``aux_out``,
``epilogue``, ``row_scale``/``col_scale``) compile into the kernel's epilogue
(``numba_hopper.kernels.epilogue``): a call without them runs the plain kernel, unchanged.

The call path. The first call with a new layout (shapes, strides, dtypes, 16-byte alignment,
device, epilogue options, ``config``, ``split_k``) checks everything and builds a plan
(:mod:`.plan`: kernel choice, tensor-map templates, prepared launches); later calls with that
layout look the plan up by those attributes alone (:mod:`.plan_cache`) and pass the new
addresses: no descriptor encode, no upload, no device allocation but the output's (through
the caller's framework), no synchronization. A call returns as soon as its launches are queued.
"""

from __future__ import annotations

import dataclasses

from ..runtime import debug as _debug
from ..runtime.arrays import byte_span, device_view, is_col_major, tma_addressable
from .checks import (FP8_DTYPES, check_fp8_operands, check_inputs, check_out, check_out_dtype, default_out_dtype,
                     overlap_pairs, rows_of)
from .fusion import VALUE_OPERANDS, check_fusion, fusion_args, fusion_key_and_values
from .heuristics import SUSTAINED
from ..runtime.operands import describe
from .plan import A, B, OUT, USER, VALUE_INDEX, VALUE_OPERANDS as _FUSED, Plan, bmm_plan, gemm_plan, gemm_sum_plan, \
    glu_backward_plan, pair_values, zero_fill_plan
from .plan_cache import PLAN_CACHE_SIZE, clear_plans, empty_output, first_run, plans, remember, run
from .scales import NUMBER, fold_scales, scale_binder, scale_signature
from ..errors import DeviceMismatchError, DtypeError, LayoutError, ShapeError
from ..kernels.epilogue_config import GLU_ACTIVATIONS
from ..kernels.gemm_config import MAX_K_SEGMENTS, GemmConfig

__all__ = ["gemm", "gemm_sum", "gemm_glu_backward", "bmm", "GemmConfig", "PLAN_CACHE_SIZE", "clear_plans"]

# The arrays a fused call reads or writes beside a, b and out, for the overlap checks:
# (name, its operand's name, VALUE_INDEX).
_READ = tuple((op.keyword, op.name, VALUE_INDEX[op.name]) for op in VALUE_OPERANDS if op.access == "read")
_WRITTEN = tuple((op.keyword, op.name, VALUE_INDEX[op.name]) for op in VALUE_OPERANDS if op.access == "written")


def gemm(a, b, out=None, *, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None,
         out_dtype=None, aux_out=None, epilogue=None, epilogue_args=(), row_scale=None, col_scale=None,
         scale_a=None, scale_b=None, scale_out=None, amax_out=None, up=None, use_fast_accum=False, dtype=None,
         stream=None, config=None, split_k=None, debug=None):
    """Return ``a @ b`` for ``a`` of shape (M, K) and ``b`` of shape (K, N), or with a fused
    epilogue ``act(alpha * row_scale[:, None] * col_scale[None, :] * (a @ b) + beta * c + bias)``.

    ``a`` may have more dimensions, (..., K), as ``torch.matmul`` takes a batch of
    activations: its leading dimensions are the M rows, read in place (their strides must
    merge into one row stride, else ``LayoutError``), and ``out``, ``c`` and ``aux_out`` are
    (..., N) like the result (for ``bmm``'s batched products, see :func:`bmm`).

    ``out_dtype``: "bf16", "f16", "f32", "e4m3" or "e5m2" (default: the input dtype, bf16 for
    fp8 inputs, or ``out``'s dtype; fp8 outputs below). ``dtype``: how to read ``uint16`` inputs ("bf16" or "f16") or ``uint8``
    ones ("e4m3" or "e5m2"), for arrays without those dtypes.
    ``stream``: a numba, CuPy or PyTorch stream or a raw ``CUstream`` handle; default the
    current PyTorch stream for PyTorch inputs, else the default stream.
    ``config``: a :class:`GemmConfig` to override the kernel choice (layouts, dtypes and the
    fused features in it are ignored; they come from the arrays and keywords), or "sustained":
    the default choice tuned for products run back to back at the board's power limit, as a
    training step runs them, where the default is tuned for bursts. Plain 16-bit products of two
    waves or more then take 128 x 256 tiles in 2x1 clusters in place of ping-pong tiles, and
    forward (``x @ W.T``) and weight-gradient (``dY.T @ X``) products in place of any other
    128-row tile: the cluster shares each B tile through multicast, which costs less energy per
    FLOP, so a higher clock at the limit (0.5-5% faster there), though slower in bursts
    (:func:`numba_hopper.matmul.heuristics.sustained_clusters_pay`). ``numba_hopper.torch``'s
    training products use it.
    ``split_k``: the number of K slices (an int >= 1), each computed by the GEMM kernel into
    fp32 partial sums that a second kernel adds in a fixed order; None (default): the
    heuristic's choice, which splits plain 16-bit products whose tiles leave most SMs idle.

    Fused epilogue, computed in float32 on the accumulator before the output is rounded
    (each part costs only when given):

    - ``alpha``, ``beta``: scalars; ``c``: an (M, N) matrix (bf16/f16/f32, any layout),
      read only if ``beta != 0`` (BLAS). ``out`` may be ``c`` (in-place update).
    - ``bias``: bf16/f16/f32, added to every row: one value per column, length N, whatever M
      and N are (as ``torch.addmm`` and ``F.linear`` broadcast a 1-D bias); also as (1, N).
      Per row, length M: ``bias_dim=0``, or an (M, 1) bias. ``bias_dim``: None (by the
      shape: the default), 1 (per column) or 0 (per row); a bias of another length raises
      ``ShapeError`` naming the lengths that fit.
    - ``activation``: None, "relu", "gelu" (erf), "gelu_tanh", "silu" or "sigmoid"
      ("gelu_tanh", "silu" and "sigmoid" use the hardware ``tanh.approx.f32``, relative
      error about 2^-11).
    - ``aux_out``: an (M, N) array (bf16/f16/f32) that receives the value before the
      activation (for a backward pass).
    - ``epilogue``: a ``@cuda.jit(device=True)`` function ``f(value, row, col, *epilogue_args)``
      returning the new value, applied after the activation to every element of the M x N
      output (float32 ``value``, int64 ``row`` and ``col``); ``epilogue_args``: a tuple of
      device arrays and scalars passed through. It is compiled into the kernel (one kernel
      per function), so keep it small: it runs in the registers of the epilogue.
    - ``row_scale`` (length M), ``col_scale`` (length N): float32 vectors.
    - ``up``: a second (K, N) operand like ``b``, for a gated linear unit:
      ``out = activation(a @ b) * (a @ up)`` (SwiGLU's ``silu(x @ W_gate.T) * (x @ W_up.T)`` with
      ``b = W_gate.t()``, ``up = W_up.t()``; GeGLU with "gelu"). One kernel computes both
      products in one tile (its B tile is ``b``'s columns beside ``up``'s) and writes only the
      gated output: the two (M, N) products never reach memory, unless ``aux_out`` (M, 2N) asks
      for them (``aux_out[:, :N] = a @ b``, ``aux_out[:, N:] = a @ up``: what the gated unit's
      backward reads). 16-bit ``a``, ``b`` and ``up`` of one dtype, ``b`` and ``up``
      column-major (``w.t()`` of row-major (N, K) weights) and TMA-addressable, a row-major
      ``out``, no other epilogue option than ``activation`` and ``aux_out``.

    FP8 (``a`` and ``b`` each ``float8_e4m3fn`` or ``float8_e5m2``, mixed included; numba/CuPy:
    uint8 arrays with ``dtype="e4m3"``/``"e5m2"`` for both), accumulated in float32, output
    bf16 by default (as ``torch._scaled_mm``), or f16/f32/fp8:

    - layout: fp8 wgmma reads K-major operands only, so ``a`` must be row-major (M, K) and
      ``b`` column-major (K, N): ``w.t()`` of a row-major (N, K) weight ("TN"), with K a
      multiple of 16 and 16-byte-aligned bases. Anything else raises ``LayoutError`` before
      launch (fix: ``b.t().contiguous().t()``); fp8 operands are never copied.
    - ``scale_a``, ``scale_b``: dequantization scales, ``out = (scale_a * a) @ (b * scale_b)``.
      Per-tensor: a Python number (multiplied into ``alpha``) or a one-element float32 device
      array (read by the kernel: no synchronization). Row-wise: a float32 vector of M
      (``scale_a``) or N (``scale_b``) values, also as (M, 1) / (1, N). They become the
      fused epilogue's ``row_scale``/``col_scale`` and compose with all of it; a vector
      ``scale_a`` (``scale_b``) cannot be given with ``row_scale`` (``col_scale``). 16-bit
      inputs take them too.
    - block-wise (DeepSeek-V3's recipe, as ``torch._scaled_mm``'s 1 x 128 / 128 x 128):
      ``scale_a`` float32 (M, ceil(K / 128)), one per row and 128 K, with ``scale_b`` float32
      (ceil(K / 128), ceil(N / 128)), one per 128 x 128 block of ``b`` (K, N); any strides.
      The kernel scales each 128-deep k-block's product and adds it to an f32 register sum
      (two-level accumulation), on 64- to 256-wide tiles (a 192- or 256-wide one spans two of
      ``scale_b``'s blocks; not with ``col_scale`` or a column bias); any
      K (a partial last block reads its scale like the others), a row-major output, and the
      rest of the fused epilogue (``row_scale``/``col_scale`` included) after it.
    - accuracy: products are exact in float32, but FP8 wgmma accumulates in about 14 bits. So
      every fp8 product adds each 128-deep k-block's sum into an f32 register sum (two-level
      accumulation, as ``torch._scaled_mm``'s default, cuBLASLt's): the relative Frobenius
      error against float64 of the dequantized operands is bounded by the output rounding
      (5e-3 bf16, 1e-3 f16/f32) plus 3e-4, whatever K (measured about 1.2e-4 at K = 16384).
      ``use_fast_accum=True`` (per-tensor, row-wise and unscaled products; block-wise ones
      always promote) accumulates in the tensor cores throughout, as
      ``torch._scaled_mm(use_fast_accum=True)``: faster where promotion costs, with an error
      that grows with K, bounded by the rounding plus 6.4e-7 * K.
    - fp8 outputs (``out_dtype="e4m3"``/``"e5m2"``; torch float8 tensors, or uint8 arrays
      with ``out_dtype``), from any inputs: ``out = fp8(scale_out * z)``, where ``z`` is the
      whole fused epilogue's value, converted with round-to-nearest and saturation to the
      largest finite fp8 value (e4m3: 448, which has no infinity; a NaN stays NaN; torch's
      ``.to(float8)`` does not saturate). ``scale_out``: a Python number or a one-element float32
      device array (read by the kernel), as ``torch._scaled_mm``'s ``scale_result``; fp8
      outputs only. Split-K does not write fp8 (such calls do not split).
    - ``amax_out``: a one-element float32 device array that receives ``max |z|`` over the
      output, before ``scale_out`` (what a delayed-scaling recipe records to pick the next
      scale), for any output dtype. It is zeroed on the stream before the kernel (one memset:
      a driver call, no wait), then raised by one atomic max per warp; a NaN in ``z`` makes it NaN.
    - tiles: promoted products take tiles priced for promotion; ``use_fast_accum=True`` ones the
      16-bit products' tiles, or 128 x 128 ping-pong tiles where those fill their waves (one
      consumer's epilogue then runs under the other's mainloop).
    - not supported yet: ``bmm`` of fp8 operands (``DtypeError``).
    - first calls: the prebuilt set (``numba_hopper.tools.prebuild``) holds the kernels of
      e4m3 x e4m3 and e5m2 x e4m3 products with each scaling in ``torch._scaled_mm``'s layouts
      and a bf16 or f16 output; other fp8 kernels compile on first use, then come from the
      disk cache.

    Split-K's K slices produce partial sums, not outputs, so the only fused epilogue it runs
    is a scale-only one (``alpha``, ``row_scale``, ``col_scale``, per-tensor or row-wise
    ``scale_a``/``scale_b``), which its reduce kernel applies; such calls split only when asked
    (``split_k=n``).
    Results are deterministic (bitwise the same on every call) on every path: split-K sums
    its slices in a fixed order in a second kernel, and stream-K (``config=GemmConfig(...,
    stream_k=True)``, never chosen automatically: it measured slower on every shape of
    ``benchmarks/bench_gemm.py``'s sweep) adds each tile's partial sums in CTA order.

    ``debug``: run the debug build (bounded pipeline waits) and synchronize; a hang raises
    :class:`~numba_hopper.errors.PipelineHangError` (default: ``numba_hopper.runtime.debug.DEFAULT``,
    from ``NUMBA_HOPPER_DEBUG``).

    Raises, before anything is launched (``numba_hopper.errors``): ``DtypeError``
    (a TypeError: dtypes; array kinds raise a plain TypeError), ``ShapeError``,
    ``LayoutError`` (negative strides, a broadcast ``out``), ``OverlapError`` (``out`` or
    ``aux_out`` sharing memory with an operand; ``out`` may be exactly ``c``),
    ``DeviceMismatchError`` (all ValueErrors) and
    ``UnsupportedDeviceError`` (a RuntimeError) when there is no Hopper GPU. Empty outputs
    launch nothing. ``K == 0`` gives the fused epilogue of a zero product (``act(beta * c +
    bias)`` and so on: the kernel runs on one zero-filled k-block in scratch), or zero-fills
    ``out`` when there is none.
    """
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be None or an int >= 1, got {split_k!r}")  # (before the key: True == 1)
    if not isinstance(use_fast_accum, bool):
        raise TypeError(f"use_fast_accum must be a bool, got {use_fast_accum!r}")
    sig_a, pa = describe(a)
    sig_b, pb = describe(b)
    sig_o, po = describe(out) if out is not None else (None, 0)
    if debug is None:
        debug = _debug.DEFAULT
    scaled_key = None
    if (scale_a is not None or scale_b is not None) and not debug and alpha == 1.0 and beta == 0.0 and c is None \
            and bias is None and bias_dim is None and activation is None and aux_out is None and epilogue is None \
            and row_scale is None and col_scale is None and not epilogue_args and scale_out is None \
            and amax_out is None and up is None:
        # fp8's usual call: the scales alone, looked up by their layouts (fold_scales checks them once).
        (kind_a, value_a), (kind_b, value_b) = scale_signature(scale_a), scale_signature(scale_b)
        scale = (value_a if kind_a in (None, NUMBER) else 1.0) * (value_b if kind_b in (None, NUMBER) else 1.0)
        scaled_key = ("gemm", sig_a, sig_b, sig_o, out_dtype, dtype, config, split_k, use_fast_accum, "scales", kind_a,
                      kind_b, scale != 1.0)
        entry = plans.get(scaled_key)
        if entry is not None:
            return run(entry, out, pa, pb, po, entry.bind(scale, value_a, value_b), stream)
    block_scales = None
    if scale_a is not None or scale_b is not None:
        alpha, row_scale, col_scale, block_scales = fold_scales(a, b, scale_a, scale_b, alpha, row_scale, col_scale)
    if (alpha == 1.0 and beta == 0.0 and c is None and bias is None and bias_dim is None and activation is None
            and aux_out is None and epilogue is None and row_scale is None and col_scale is None
            and not epilogue_args and block_scales is None and scale_out is None and amax_out is None and up is None):
        f, fkey, fvalues = None, None, ()
    else:
        f = fusion_args(alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, epilogue_args, row_scale,
                        col_scale, block_scales, scale_out, amax_out, up)
        fkey, fvalues = fusion_key_and_values(f)
    key = ("gemm", sig_a, sig_b, sig_o, out_dtype, dtype, config, split_k, use_fast_accum, fkey)
    entry = None if debug else plans.get(key)
    if entry is None:
        result = _first_gemm(key, a, b, out, f, fvalues, out_dtype, dtype, stream, config, split_k, use_fast_accum,
                             debug)
        entry = None if debug else plans.get(key)
    else:
        result = run(entry, out, pa, pb, po, fvalues, stream)
    if scaled_key is not None and entry is not None and None not in (sig_a, sig_b):
        entry.bind = scale_binder(scale_a, scale_b, block_scales)
        remember(scaled_key, entry)
    return result


def bmm(a, b, out=None, *, out_dtype=None, dtype=None, stream=None, config=None):
    """Batched ``out[i] = a[i] @ b[i]`` for ``a`` (B, M, K) and ``b`` (B, K, N): one GEMM launch.

    Either operand may be 2-D, or have a batch stride of 0 (``torch.expand``), to use one
    matrix for every batch item. Each matrix of ``a``, ``b`` and ``out`` may be row- or
    column-major, with any leading dimension and batch stride, as ``gemm`` takes them:
    operands TMA cannot address (a leading dimension or batch stride that is not a multiple
    of 16 bytes, a misaligned base, as in a bf16 (10, 5, 10) x (10, 10, 5) product, or other
    strides) are first copied into aligned scratch, one copy kernel per operand for the whole
    batch, and an ``out`` that TMA cannot write receives the result through one (its bytes
    moved twice). ``K == 0`` zero-fills ``out``.
    Other arguments as for :func:`gemm` (no fused epilogue: those options are gemm's).
    """
    sig_a, pa = describe(a)
    sig_b, pb = describe(b)
    sig_o, po = describe(out) if out is not None else (None, 0)
    key = ("bmm", sig_a, sig_b, sig_o, out_dtype, dtype, config)
    entry = plans.get(key)
    if entry is None:
        return _first_bmm(key, a, b, out, out_dtype, dtype, stream, config)
    return run(entry, out, pa, pb, po, (), stream)


def gemm_sum(pairs, out=None, *, out_dtype=None, dtype=None, stream=None, config=None, debug=None):
    """Return ``a_0 @ b_0 + a_1 @ b_1 + ...`` for ``pairs``, a sequence of one to three ``(a_i, b_i)``
    with ``a_i`` of shape (M, K_i) and ``b_i`` of shape (K_i, N): one kernel, whose K loop runs
    over each pair's k-blocks in turn into one accumulator, so the sum costs one epilogue and
    no pass over partial outputs. It is the product ``[a_0 a_1 ...] @ [b_0; b_1; ...]`` without
    the concatenations: the gradient of an activation that several linears read (a transformer's
    query, key and value projections, or a gated MLP's gate and up projections) is
    ``sum(dy_i @ W_i)``.

    16-bit inputs of one dtype (fp32 accumulation); each ``a_i`` and ``b_i`` row- or
    column-major, as :func:`gemm` takes them; one major serves all pairs' A and all B, so an
    operand in the other major, like one TMA cannot address, is read through an aligned copy
    (one more kernel each). The other arguments are :func:`gemm`'s; no fused epilogue,
    split-K or fp8. ``config``: a :class:`GemmConfig` (its ``k_segments`` is the pairs'
    count) or "sustained". Pairs with K_i == 0 add nothing; with no K at all ``out`` is
    zero-filled.

    Raises before launch, as :func:`gemm`: ``ShapeError`` (a pair's K, the pairs' M or N
    differing, or a pair count outside 1 to 3), ``TypeError`` (an item that is not a pair),
    ``DtypeError``, ``LayoutError``, ``OverlapError`` (``out`` sharing memory with an operand),
    ``DeviceMismatchError``.
    """
    pairs = tuple(pairs)
    if not 1 <= len(pairs) <= MAX_K_SEGMENTS:
        raise ShapeError(f"gemm_sum takes 1 to {MAX_K_SEGMENTS} (a, b) pairs; got {len(pairs)}")
    if any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in pairs):
        raise TypeError("gemm_sum takes a sequence of (a, b) pairs: tuples or lists of two arrays")
    sigs, addresses = zip(*(describe(x) for pair in pairs for x in pair))
    sig_o, po = describe(out) if out is not None else (None, 0)
    if debug is None:
        debug = _debug.DEFAULT
    key = ("gemm_sum", sigs, sig_o, out_dtype, dtype, config)
    fvalues = (0,) * len(_FUSED) + addresses[2:]
    entry = None if debug else plans.get(key)
    if entry is not None:
        return run(entry, out, addresses[0], addresses[1], po, fvalues, stream)
    return _first_gemm_sum(key, pairs, addresses, out, fvalues, out_dtype, dtype, stream, config, debug)


def _first_gemm_sum(key, pairs, addresses, out, fvalues, out_dtype, dtype, stream, config, debug):
    """A sum with a new layout: check everything, build its plan, run it, keep it."""
    if not (config is None or config == SUSTAINED or isinstance(config, GemmConfig)):
        raise TypeError(f"config must be None, a GemmConfig or {SUSTAINED!r}; got {config!r}")
    views = [(device_view(a, dtype=dtype), device_view(b, dtype=dtype)) for a, b in pairs]
    va0, vb0 = views[0]
    for i, (va, vb) in enumerate(views):
        check_inputs(va, vb)
        if va.dtype in FP8_DTYPES or va.dtype != va0.dtype:
            raise DtypeError(f"gemm_sum takes 16-bit pairs of one dtype; pair {i} is {va.dtype} x {vb.dtype}, "
                             f"pair 0 {va0.dtype}")
        if (va.shape[0], vb.shape[1]) != (va0.shape[0], vb0.shape[1]):
            raise ShapeError(f"gemm_sum's products must share one (M, N): pair {i} is ({va.shape[0]}, {vb.shape[1]}), "
                             f"pair 0 ({va0.shape[0]}, {vb0.shape[1]})")
        if va.device != va0.device:
            raise DeviceMismatchError(f"pair {i} is on device {va.device}, pair 0 on device {va0.device}")
    M, N = va0.shape[0], vb0.shape[1]
    vo = _checked_out(out, (M, N), va0, out_dtype)
    summed = [i for i, (va, _) in enumerate(views) if va.shape[1]]

    def plan_for(vo):
        if 0 in vo.shape:
            return Plan(vo.device, [])
        return gemm_sum_plan(views, vo, config, debug) if summed else zero_fill_plan(vo)

    if summed and len(summed) < len(views):  # (pairs of K == 0 add nothing: the call without them)
        return gemm_sum([pairs[i] for i in summed], out, out_dtype=out_dtype, dtype=dtype, stream=stream,
                        config=config, debug=debug)
    read = [(f"pairs[{i}][{j}]", pair_values(i)[j], v) for i, pair in enumerate(views) for j, v in enumerate(pair)]
    written = [("out", OUT, vo)] if vo else []
    return first_run(key, plan_for, pairs[0][0], out, vo, (M, N), out_dtype, va0, addresses[:2], fvalues, stream,
                     overlap_pairs(_spans(written), _spans(read)), cache=not debug)


def gemm_glu_backward(a, b, gate, up, out=None, out_up=None, *, activation="silu", dtype=None, stream=None,
                      config=None, debug=None):
    """Return ``(d_gate, d_up)``, the gradients of a gated linear unit ``h = act(gate) * up``'s
    two inputs, given ``dh = a @ b``: ``d_gate = dh * up * act'(gate)`` and ``d_up = dh *
    act(gate)``, in one kernel whose epilogue reads ``gate`` and ``up`` and writes both, so
    ``dh`` never reaches memory. In a gated MLP ``down(act(x @ W_gate.T) * (x @ W_up.T))``,
    ``a`` is the output's gradient ``dy`` and ``b`` the down projection's weight ``W_down``
    (hidden, intermediate), with ``gate`` and ``up`` the forward's two products.

    16-bit ``a`` (M, K) and ``b`` (K, N) of one dtype, row- or column-major as :func:`gemm`
    takes them; ``gate``, ``up`` and the outputs ``out`` and ``out_up`` (made when None) (M,
    N) of that dtype, row-major, with 16-byte-aligned bases and rows. ``activation``: "silu"
    (whose sigmoid is the hardware ``tanh.approx.f32``'s, relative error about 2^-11).
    ``config``: a :class:`GemmConfig` (its epilogue becomes the GLU's) or "sustained".

    Raises before launch: ``ShapeError``, ``DtypeError``, ``LayoutError``, ``OverlapError``
    (an output sharing memory with another array), ``DeviceMismatchError``, ``ValueError``
    (another activation).
    """
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GLU_ACTIVATIONS}; got {activation!r}")
    (sig_a, pa), (sig_b, pb), (sig_g, pg), (sig_u, pu) = (describe(x) for x in (a, b, gate, up))
    sig_du = describe(out_up)[0] if out_up is not None else None
    sig_o, po = describe(out) if out is not None else (None, 0)
    if debug is None:
        debug = _debug.DEFAULT
    key = ("gemm_glu_backward", sig_a, sig_b, sig_g, sig_u, sig_du, sig_o, activation, dtype, config)
    entry = None if debug else plans.get(key)
    if entry is None:
        _check_glu_backward(a, b, gate, up, out, out_up, dtype, config)
    if out_up is None:
        vg = device_view(gate, dtype=dtype)
        out_up = empty_output(gate, vg, vg.shape, vg.dtype)
    fvalues = (0,) * len(_FUSED) + (pg, pu, describe(out_up)[1])
    if entry is not None:
        return run(entry, out, pa, pb, po, fvalues, stream), out_up
    va, vb = device_view(a, dtype=dtype), device_view(b, dtype=dtype)
    vo = _checked_out(out, (va.shape[0], vb.shape[1]), va, va.dtype)
    vg, vu, vdu = (device_view(x, dtype=dtype) for x in (gate, up, out_up))

    def plan_for(vo):
        if 0 in vo.shape:
            return Plan(vo.device, [])
        return glu_backward_plan(va, vb, vo, vg, vu, vdu, activation, config, debug)

    read = [("a", A, va), ("b", B, vb), ("gate", USER, vg), ("up", USER + 1, vu)]
    written = ([("out", OUT, vo)] if vo else []) + [("out_up", USER + 2, vdu)]
    d_gate = first_run(key, plan_for, a, out, vo, vg.shape, va.dtype, va, (pa, pb), fvalues, stream,
                       overlap_pairs(_spans(written), _spans(read)), cache=not debug)
    return d_gate, out_up


def _check_glu_backward(a, b, gate, up, out, out_up, dtype, config):
    """Raise unless :func:`gemm_glu_backward` can run these arguments (its docstring)."""
    if not (config is None or config == SUSTAINED or isinstance(config, GemmConfig)):
        raise TypeError(f"config must be None, a GemmConfig or {SUSTAINED!r}; got {config!r}")
    va, vb = device_view(a, dtype=dtype), device_view(b, dtype=dtype)
    check_inputs(va, vb)
    if va.dtype in FP8_DTYPES:
        raise DtypeError(f"gemm_glu_backward takes 16-bit a and b; got {va.dtype} x {vb.dtype}")
    shape = (va.shape[0], vb.shape[1])
    for name, x in (("gate", gate), ("up", up), ("out", out), ("out_up", out_up)):
        if x is None:
            continue
        v = device_view(x, dtype=dtype)
        check_out(v, shape, va.device, va.dtype, name=name)
        if 0 not in shape and not tma_addressable(v, row_major=True):
            raise LayoutError(f"gemm_glu_backward needs {name} row-major with a 16-byte-aligned base and rows; "
                              f"got strides {v.strides}")


def _first_gemm(key, a, b, out, f, fvalues, out_dtype, dtype, stream, config, split_k, fast_accum, debug):
    """A call with a new layout: check everything, build its plan, run it, keep it."""
    if not (config is None or config == SUSTAINED or isinstance(config, GemmConfig)):
        raise TypeError(f"config must be None, a GemmConfig or {SUSTAINED!r}; got {config!r}")
    va, vb = device_view(a, dtype=dtype), device_view(b, dtype=dtype)
    a_shape, rows = va.shape, va.shape[:-1]  # the output's leading dimensions: a (..., K) is read as (rows, K)
    va = rows_of("a", va)
    check_inputs(va, vb, a_shape)
    fp8 = va.dtype in FP8_DTYPES
    if fp8:
        check_fp8_operands(va, vb)
    M, K = va.shape
    N = vb.shape[1]
    vo = _checked_out(out, (*rows, N), va, out_dtype)
    # ``dtype`` reads uint16 epilogue arrays as bf16/f16; an fp8 one names the operands only.
    fusion = f and check_fusion(f, M, N, K, va.device, None if fp8 else dtype,
                                vo.dtype if vo else out_dtype or default_out_dtype(va.dtype), rows)
    operands = fusion.operands if fusion else {}
    if fusion and fusion.block_scaled:
        if not fp8:
            raise DtypeError(f"block-wise scales are for fp8 operands; a and b are {va.dtype}")
        if vo and is_col_major(vo):  # the kernel would compute out.T, whose A is b (128 x 128 blocks)
            raise LayoutError("block-wise scales need a row-major out; got a column-major one")
    if fusion and fusion.gated:
        _check_gated(va, vb, operands["up"], vo)
    read = [("a", A, va), ("b", B, vb)] + [(kw, i, operands[n]) for kw, n, i in _READ if n in operands]
    written = ([("out", OUT, vo)] if vo else []) + [(kw, i, operands[n]) for kw, n, i in _WRITTEN if n in operands]
    c = operands.get("c")
    in_place = {("out", "c")} if vo and c and _same_layout(vo, c) else ()

    def plan_for(vo):
        if 0 in vo.shape:
            return Plan(vo.device, [])
        vo = rows_of("out", vo)
        if K == 0:  # the epilogue of a zero product: the kernel on zeros, or no epilogue at all
            zero = fusion and fusion.of_zero_product()
            return gemm_plan(va, vb, vo, zero, config, debug) if zero else zero_fill_plan(vo)
        return gemm_plan(va, vb, vo, fusion, config, debug, split_k, fast_accum)

    return first_run(key, plan_for, a, out, vo, (*rows, N), out_dtype, va, (va.ptr, vb.ptr), fvalues,
                     stream, overlap_pairs(_spans(written), _spans(read), in_place), cache=not debug)


def _check_gated(va, vb, vu, vo):
    """A gated product's operands (``gemm(..., up=)``): 16-bit, ``b`` and ``up`` of one dtype and
    K-major (the kernel loads each tile's rows of both into one B slot), ``out`` row-major."""
    if va.dtype in FP8_DTYPES or vu.dtype != vb.dtype:
        raise DtypeError(f"up= takes 16-bit a, b and up of one dtype; got a {va.dtype}, b {vb.dtype}, up {vu.dtype}")
    for name, v in (("b", vb), ("up", vu)) if va.shape[1] else ():  # (K == 0 reads neither)
        if not tma_addressable(v, row_major=False):
            raise LayoutError(f"up= needs {name} column-major (K, N) with a 16-byte-aligned base and leading "
                              f"dimension, as w.t() of a row-major (N, K) weight; got strides {v.strides}")
    if vo is not None and is_col_major(rows_of("out", vo)):
        raise LayoutError("up= writes a row-major out; got a column-major one")


def _first_bmm(key, a, b, out, out_dtype, dtype, stream, config):
    va, vb = device_view(a, dtype=dtype), device_view(b, dtype=dtype)
    for name, v in (("a", va), ("b", vb)):
        if len(v.shape) not in (2, 3):
            raise ShapeError(f"{name} must be 2-D or 3-D, got shape {v.shape}")
    (ba, sa, ma), (bb, sb, mb) = _batch_split(va), _batch_split(vb)
    check_inputs(ma, mb)
    if ma.dtype in FP8_DTYPES:
        raise DtypeError(f"bmm does not take fp8 operands yet (got {ma.dtype}); gemm does")
    batch = max(ba, bb)
    if {ba, bb} - {1, batch}:
        raise ShapeError(f"batch sizes {ba} and {bb} do not broadcast")
    M, K, N = ma.shape[0], ma.shape[1], mb.shape[1]
    vo = _checked_out(out, (batch, M, N), va, out_dtype)

    def plan_for(vo):
        _, so, mo = _batch_split(vo)
        if 0 in vo.shape:
            return Plan(vo.device, [])
        if K == 0:
            return zero_fill_plan(mo, batch, so)
        return bmm_plan(ma, mb, mo, batch, (sa, sb, so), config)

    written = [("out", OUT, vo)] if vo else []
    return first_run(key, plan_for, a, out, vo, (batch, M, N), out_dtype, va, (va.ptr, vb.ptr), (), stream,
                     overlap_pairs(_spans(written), _spans([("a", A, va), ("b", B, vb)])), cache=True)


def _checked_out(out, shape, va, out_dtype):
    """``out``'s checked view, or None when the call makes the output (``out_dtype`` checked)."""
    if out is None:
        check_out_dtype("out_dtype", out_dtype or default_out_dtype(va.dtype))
        return None
    vo = device_view(out, dtype=out_dtype)
    check_out(vo, shape, va.device, out_dtype)
    return vo


def _spans(arrays):
    return tuple((name, index, byte_span(v)) for name, index, v in arrays)


def _same_layout(v, w):
    return (tuple(v.shape), tuple(v.strides), v.itemsize) == (tuple(w.shape), tuple(w.strides), w.itemsize)


def _batch_split(v):
    """``(batch count, batch stride in elements (0: broadcast), 2-D view of item 0)``."""
    if len(v.shape) == 2:
        return 1, 0, v
    count, stride = v.shape[0], v.strides[0] if v.shape[0] > 1 else 0
    return count, stride, dataclasses.replace(v, shape=v.shape[1:], strides=v.strides[1:])
