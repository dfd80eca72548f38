"""``numba_hopper.attention``: scaled dot-product attention forward on Hopper, FlashAttention-3's
design on numba_hopper's kit (:mod:`.kernel`).

The call path. The first call with a new layout (shapes, strides, dtype, device, options) checks
everything (:mod:`.checks`) and builds a plan: the kernel of its head dim and dtype, tensor-map
templates of Q, K, V and O, and a prepared launch. Later calls with that layout look the plan up
and only set the new addresses in the launch's arguments: no encoding, no allocation but the
output's (through PyTorch), no synchronization. The first call of a kernel in a process compiles
it (seconds; then kept on disk, ``numba_hopper.runtime.kernel_cache``): warm up before capturing
a CUDA graph. The first call of a dense causal layout also copies its balanced schedule to the
device (:func:`_schedule`) on a stream of its own and waits for that copy alone (never for the
work queued on the caller's streams), so that a launch on any stream may read it.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import numpy as np

from ..runtime.arrays import DeviceView
from ..runtime.device import on_device
from ..runtime.launch import device_limits, prepare_launch
from ..runtime.tensormap import TensorMapArg, encode_template
from .checks import addressable, check_call, check_config, check_device
from .config import AttentionParams, attention_config, l2_section, tuned_configs
from .kernel import make_attention_kernel
from .scheduler import balanced_schedule, pair_items, tile_costs

__all__ = ["attention", "PLAN_CACHE_SIZE", "clear_plans", "precompile", "cache_key"]

PLAN_CACHE_SIZE = 256
_plans: "OrderedDict[tuple, _Plan]" = OrderedDict()
# Balanced schedules (device tables, kept for the process: a launch in flight on any stream may
# read one, so none is freed): up to MAX_SCHEDULES of them, of launches up to
# MAX_SCHEDULED_TILES query tiles (beyond, each CTA walks 250 tiles or more and the paired
# walk's quantization is under 0.5%; 0 sends every launch down the paired walk, as
# benchmarks/bench_attention_schedule.py does to compare them: part of a plan's key).
MAX_SCHEDULES = 64
MAX_SCHEDULED_TILES = 1 << 15
_schedules: dict = {}
_lock = threading.Lock()
# a call's values: the addresses a prepared launch takes anew each call
Q, K, V, O, LSE, CU_Q, CU_K = range(7)
_MAP_VALUES = (Q, K, V, O)
LOG2E = 1.4426950408889634
_FIELD_VALUES = {"out": O, "lse": LSE, "cu_seqlens_q": CU_Q, "cu_seqlens_k": CU_K}


def attention(q, k, v, *, causal=False, causal_align="bottom_right", scale=None, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False, out=None, stream=None,
              config=None):
    """Softmax attention ``softmax(q k^T * scale) v`` of PyTorch CUDA tensors on a Hopper GPU.

    Layouts:

    - dense: ``q`` (batch, heads, seqlen_q, head_dim), ``k`` and ``v`` (batch, kv_heads, seqlen_k,
      head_dim): SDPA's layout, returned as ``q``'s shape (a new contiguous tensor, or ``out``);
    - packed (``flash_attn_varlen_func``'s): ``q`` (total_q, heads, head_dim), ``k`` and ``v``
      (total_k, kv_heads, head_dim), sequence ``b`` being rows ``cu_seqlens_q[b] ..
      cu_seqlens_q[b+1]`` (int32, batch + 1 offsets on the device) and likewise for the keys;
      ``max_seqlen_q`` / ``max_seqlen_k`` (ints) bound the sequence lengths (not checked against
      the offsets, which live on the GPU: a longer sequence would have rows left unwritten).

    Any strides TMA can address are read in place: the head dim contiguous, every other stride
    a multiple of 16 bytes (8 elements), the data 16-byte aligned; SDPA's transposed views of a
    (batch, seq, heads, head_dim) projection qualify. Other inputs are copied first
    (``.contiguous()``, one read and write of that tensor); ``out`` must be addressable.

    - dtypes: bfloat16 or float16 (all three alike), float32 softmax and accumulation;
    - head dims 64, 128 and 256; ``v``'s head dim equal to ``q``'s;
    - grouped-query / multi-query attention: ``heads`` a multiple of ``kv_heads``, query head
      ``h`` reading K/V head ``h // (heads // kv_heads)``;
    - ``scale``: default ``1 / sqrt(head_dim)``; must be positive;
    - ``causal``: query ``i`` sees keys ``j <= i + seqlen_k - seqlen_q`` (``causal_align=
      "bottom_right"``, the default, FlashAttention's) or ``j <= i`` (``"top_left"``, SDPA's
      ``is_causal``); the same when ``seqlen_q == seqlen_k``. Per sequence when packed;
    - any sequence length, partial tiles masked; empty sequences allowed;
    - ``return_lse``: also return the natural log-sum-exp of each row's scaled scores, float32,
      (batch, heads, seqlen_q) dense or (heads, total_q) packed (FlashAttention's layouts);
    - a row that sees no key (causal with ``seqlen_q > seqlen_k`` bottom-right, or no keys at
      all) gets output 0 and log-sum-exp ``-inf``, as FlashAttention (SDPA gives NaN there);
    - ``stream``: any stream object or a raw handle; default PyTorch's current stream. The call
      never synchronizes;
    - ``config``: an :class:`AttentionConfig` (tiles, pipeline depth, consumer warpgroups) to run
      instead of the tuned one (:func:`attention_config`), of the call's head dim and dtype:
      for tuning and for comparing kernels.

    Raises before launching: ``DtypeError`` (dtypes), ``ShapeError`` (shapes, head dim, heads),
    ``LayoutError`` (an ``out`` TMA cannot write), ``DeviceMismatchError`` (tensors on different
    devices), ``TypeError`` (not CUDA tensors), ``ValueError`` (``scale``, ``causal_align``,
    packed-batch arguments), ``UnsupportedDeviceError`` (not a Hopper GPU).
    """
    import torch

    problem = check_call(q, k, v, causal, causal_align, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, out)
    if config is not None:
        check_config(config, problem)
    check_device(q.device)
    if out is None:
        out = q.new_empty(problem.out_shape)
    lse = q.new_empty(problem.lse_shape, dtype=torch.float32) if return_lse else None
    if problem.empty or problem.no_keys:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    q, k, v = (t if addressable(t) else t.contiguous() for t in (q, k, v))
    views = [_view4(t, problem.varlen, problem.dtype) for t in (q, k, v, out)]
    lse_strides = _lse_strides(problem) if return_lse else (0, 0)
    key = (q.device.index, problem, tuple((view.shape, view.strides) for view in views), lse_strides, config,
           MAX_SCHEDULED_TILES)
    values = [view.ptr for view in views] + [lse.data_ptr() if lse is not None else 0,
                                             _address(cu_seqlens_q), _address(cu_seqlens_k)]
    with on_device(q.device.index or 0):
        plan = _plans.get(key)
        if plan is None:
            plan = _plan(key, problem, views, values, lse_strides, config)
        plan(values, _stream_handle(stream, q.device))
    return (out, lse) if return_lse else out


def cache_key(cfg):
    """The on-disk kernel cache's key of ``cfg``'s kernel (``runtime.launch.prepare_launch``)."""
    return ("attention", cfg)


def precompile(configs=None, jobs=None) -> list:
    """Compile attention kernels into the on-disk kernel cache (``NUMBA_HOPPER_CACHE_DIR``) in
    ``jobs`` worker processes (default: one per kernel, at most the CPU count), so that a new
    process loads them instead of compiling each on its first call (about 10-30 s each, one
    after another). ``configs``: default ``tuned_configs()``, every kernel the calls use (bf16
    and fp16). No GPU needed; the entries are for a compute capability 9.0 device. Returns the
    entry paths written (none when the cache is off)."""
    import concurrent.futures
    import multiprocessing
    import os

    from ..runtime import kernel_cache

    if kernel_cache.cache_dir() is None:
        return []
    configs = list(configs or tuned_configs())
    jobs = jobs or min(len(configs), os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_compile_entry, configs))


def _compile_entry(cfg):
    """(In a worker) compile ``cfg``'s kernel for sm_90a and write its kernel-cache entry."""
    import os

    from .. import _numba_internals
    from ..runtime import kernel_cache
    from .config import argument_types

    argtypes = argument_types(cfg)
    kernel = _numba_internals.compile_kernel(make_attention_kernel(cfg), argtypes, (9, 0, "a"))
    path = kernel_cache.entry_path(cache_key(cfg), argtypes, (9, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + f".{os.getpid()}.tmp")
    staging.write_bytes(_numba_internals.serialize_kernel(kernel))
    os.replace(staging, path)  # (a reader sees the whole entry or none)
    return str(path)


def clear_plans():
    """Forget every plan (their tensor-map templates and prepared launches)."""
    with _lock:
        _plans.clear()


def _address(t):
    return 0 if t is None else t.data_ptr()


def _stream_handle(stream, device):
    if stream is None:
        import torch

        return torch.cuda.current_stream(device).cuda_stream
    from ..runtime.launch import as_stream_handle

    return as_stream_handle(stream)


def _view4(t, packed, dtype) -> DeviceView:
    """``t`` as the kernel's 4-D (batch, heads, rows, head_dim) view: a packed (total, heads,
    head_dim) tensor is one batch of ``total`` rows. A dimension of one element gets a stride of
    16 bytes (TMA asks every stride to be a positive multiple of 16; it never steps this one)."""
    if packed:
        shape = (1, t.shape[1], t.shape[0], t.shape[2])
        strides = (0, t.stride(1), t.stride(0), 1)
    else:
        shape, strides = tuple(t.shape), (t.stride(0), t.stride(1), t.stride(2), 1)
    strides = tuple(int(s) if n > 1 else 8 for n, s in zip(shape, strides))
    return DeviceView(t.data_ptr(), tuple(int(n) for n in shape), strides, dtype, 2, t.device.index or 0, "torch")


def _lse_strides(problem):
    """``(batch, head)`` element strides of the log-sum-exp tensor (rows contiguous)."""
    if problem.varlen:
        return 0, problem.total_q
    return problem.heads * problem.seqlen_q, problem.seqlen_q


class _Plan:
    """One layout's prepared launch; ``plan(values, stream)`` runs it at a call's addresses."""

    def __init__(self, launch, binds):
        self.launch, self.binds = launch, binds

    def __call__(self, values, stream):
        self.launch(stream, values, self.binds)


def _plan(key, problem, views, values, lse_strides, config) -> _Plan:
    """Build (and cache) the plan of ``key`` (``_attention``'s layout key), prepared at the first
    call's ``values``, for ``config`` or else the tuned configuration."""
    cfg = config or attention_config(problem.head_dim, problem.dtype, problem.causal, problem.seqlen_q)
    boxes = ((1, 1, cfg.block_m, 64), (1, 1, cfg.block_n, 64), (1, 1, cfg.block_n, 64), (1, 1, 64, 64))
    templates = [encode_template(view, box, swizzle=128) for view, box in zip(views, boxes)]
    m_blocks = max(1, -(-problem.seqlen_q // cfg.block_m))
    pairs = problem.batch * problem.heads
    items = pair_items(m_blocks, problem.causal) * pairs
    section = l2_section(pairs, problem.seqlen_k, problem.head_dim, problem.kv_group) if problem.causal else 1
    grid, positions = min(items, device_limits(key[0] or 0).sm_count), 2 * items
    schedule = _schedule(key[0] or 0, cfg, problem, m_blocks, section) if problem.causal and not problem.varlen else None
    if schedule is not None:
        grid, positions = schedule.shape[1], 2 * (schedule.shape[0] - 1) * schedule.shape[1]
    out = views[O]
    params = AttentionParams(
        maps=tuple(TensorMapArg(tmpl, values[i]) for tmpl, i in zip(templates, _MAP_VALUES)),
        batch=problem.batch, heads=problem.heads, kv_group=problem.kv_group,
        seqlen_q=problem.seqlen_q, seqlen_k=problem.seqlen_k,
        cu_seqlens_q=values[CU_Q], cu_seqlens_k=values[CU_K],
        m_blocks=m_blocks, pair_items=pair_items(m_blocks, problem.causal), positions=positions, section=section,
        schedule=0 if schedule is None else schedule.data_ptr(),
        causal=int(problem.causal), bottom_right=int(problem.bottom_right),
        scale_log2=np.float32(problem.scale * LOG2E), scale=np.float32(problem.scale),
        out=values[O], out_row=out.strides[2], out_head=out.strides[1],
        out_batch=out.strides[0] if out.shape[0] > 1 else 0,
        lse=values[LSE], lse_batch=lse_strides[0], lse_head=lse_strides[1])
    launch = prepare_launch(make_attention_kernel(cfg), grid, cfg.threads, (params,), shared_mem=cfg.shared_bytes,
                            cache_key=cache_key(cfg))
    fields = launch.leaves[0]
    binds = [(fields[0][m], v, 0) for m, v in enumerate(_MAP_VALUES)]
    binds += [(fields[AttentionParams._fields.index(name)], v, 0) for name, v in _FIELD_VALUES.items()]
    plan = _Plan(launch, tuple(binds))
    with _lock:
        _plans[key] = plan
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def _schedule(device, cfg, problem, m_blocks, section):
    """The balanced schedule (:mod:`.scheduler`) of a dense causal launch, on ``device``, made by
    the first call of its layout without waiting for the GPU's queued work; None where the
    paired walk runs instead: over :data:`MAX_SCHEDULED_TILES` tiles, with
    :data:`MAX_SCHEDULES` tables made, or while the stream is being captured (the table's copy
    cannot be)."""
    import torch

    pairs = problem.batch * problem.heads
    if m_blocks * pairs > MAX_SCHEDULED_TILES:
        return None
    diag = problem.seqlen_k - problem.seqlen_q if problem.bottom_right else 0
    costs = tile_costs(m_blocks, cfg.block_m, cfg.block_n, problem.seqlen_q, problem.seqlen_k, diag)
    ctas = min(m_blocks * pairs, device_limits(device).sm_count)
    key = (device, tuple(costs), pairs, section, ctas)
    with _lock:
        table = _schedules.get(key)
    if table is None and len(_schedules) < MAX_SCHEDULES and not torch.cuda.is_current_stream_capturing():
        upload = _upload_stream(device)
        with torch.cuda.stream(upload):
            table = torch.from_numpy(balanced_schedule(costs, pairs, section, ctas).view(np.int32)).to(upload.device)
        upload.synchronize()  # the copy alone: launches on any stream may read the table at once
        with _lock:
            table = _schedules.setdefault(key, table)
    return table


@functools.lru_cache(maxsize=None)
def _upload_stream(device):
    """A stream of ``device`` for the schedules' copies, which never waits for the work queued on
    the caller's streams (a non-blocking one: not even the legacy default stream's)."""
    import torch

    return torch.cuda.Stream(device)
