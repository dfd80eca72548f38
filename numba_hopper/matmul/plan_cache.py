"""The plan cache: call layouts -> plans, shared by every entry point (``gemm``, ``bmm``,
``grouped_gemm``).

An entry point looks its call's key up in :data:`plans` (``plans.get(key)``: what decides the
kernel and the plan, never an address), and :func:`run` s the :class:`Entry` it finds with the
call's addresses; a call with a new layout checks everything, builds the plan and runs it
through :func:`first_run`, which keeps it (:func:`remember`). The cache holds the
:data:`PLAN_CACHE_SIZE` most recently added layouts.

A call's *values* (``numba_hopper.matmul.plan``'s indices): ``[scratch, a, b, out, *fvalues]``,
the scratch address filled in by the plan, ``fvalues`` the entry point's others (the fused
epilogue's numbers and arrays, then its user arrays or a grouped call's group sizes).
"""

from __future__ import annotations

import threading

import numpy as np

from ..runtime.arrays import ITEMSIZE, DeviceView
from ..runtime.device import hopper_device_reason
from ..runtime.launch import as_stream_handle
from ..runtime.operands import current_torch_stream, describe, empty_like
from ..errors import UnsupportedDeviceError
from .checks import check_overlaps, default_out_dtype

__all__ = ["PLAN_CACHE_SIZE", "plans", "Entry", "run", "first_run", "remember", "clear_plans"]

PLAN_CACHE_SIZE = 256
plans: dict = {}
_plans_lock = threading.Lock()


class Entry:
    """A cached plan with what its calls need beside it: the pairs of arrays to check for
    overlap, how to make the output (``make_out() -> (array, address)``; None when the caller
    passes ``out``), the default stream (``current_stream() -> CUstream``) and, for calls
    whose only epilogue keywords are fp8 scales, how their values bind
    (``scales.scale_binder``)."""

    __slots__ = ("plan", "overlaps", "make_out", "current_stream", "bind")

    def __init__(self, plan, overlaps, make_out, a):
        self.plan, self.overlaps, self.make_out = plan, overlaps, make_out
        self.bind = None
        self.current_stream = current_torch_stream(a.get_device()) if hasattr(a, "data_ptr") else _default_stream


def _default_stream():
    return 0


def run(entry, out, pa, pb, po, fvalues, stream):
    """A call whose layout has a plan: make its output, check its addresses, queue its launches."""
    if out is None:
        out, po = entry.make_out()
    values = [0, pa, pb, po, *fvalues]
    if entry.overlaps:
        check_overlaps(entry.overlaps, values)
    entry.plan(entry.current_stream() if stream is None else as_stream_handle(stream), values)
    return out


def first_run(key, plan_for, a, out, vo, shape, out_dtype, va, addresses, fvalues, stream, overlaps, cache):
    """The rest of a call with a new layout, its arguments checked: the overlaps of its
    arrays, the device, the plan (``plan_for(out view)``); run it (making the output if the
    call did not pass one) and keep it under ``key`` if ``cache``. ``shape``, ``out_dtype``:
    the output's, made like ``a`` (whose view is ``va``) when ``out`` is None; ``addresses``:
    ``(a, b)``'s."""
    check_overlaps(overlaps, (0, *addresses, vo.ptr if vo else 0, *fvalues))
    reason = hopper_device_reason()
    if reason is not None:
        raise UnsupportedDeviceError(f"numba_hopper needs a Hopper GPU (compute capability 9.x): {reason}")
    make_out = None
    if out is None:  # the output the calls will make: row-major, of a's kind, on a's device
        dtype = out_dtype or default_out_dtype(va.dtype)
        make_out = _output_maker(a, va, shape, dtype)
        strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        vo = DeviceView(0, shape, strides, dtype, ITEMSIZE[dtype], va.device, va.framework)
    entry = Entry(plan_for(vo), overlaps, make_out, a)
    out = run(entry, out, *addresses, vo.ptr if out is not None else 0, fvalues, stream)
    if cache:
        remember(key, entry)
    return out


def remember(key, entry):
    """Keep ``entry`` under ``key``, forgetting the oldest entries past ``PLAN_CACHE_SIZE``."""
    with _plans_lock:  # two threads evicting the same oldest plan would KeyError
        plans[key] = entry
        while len(plans) > PLAN_CACHE_SIZE:
            plans.pop(next(iter(plans)))


def clear_plans():
    """Forget every cached plan (the next call of each layout builds its plan again)."""
    with _plans_lock:
        plans.clear()


def empty_output(a, va, shape, dtype):
    """A new contiguous array of ``shape`` and ``dtype``, of ``a``'s kind, on its device."""
    return _output_maker(a, va, shape, dtype)()[0]


def _output_maker(a, va, shape, dtype):
    """``make() -> (out, address)``: a new output of ``a``'s kind, on ``a``'s device."""
    if va.framework == "torch":
        import torch

        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "e4m3": torch.float8_e4m3fn,
               "e5m2": torch.float8_e5m2}[dtype]
        # empty_like of a broadcast one-element tensor: a contiguous array of the shape (it
        # overlaps itself, so no strides are kept), in half the host time of
        # torch.empty(shape, dtype=, device=), which parses its arguments.
        like = torch.empty(1, dtype=tdt, device=a.device).expand(shape)
        if not torch.empty_like(like).is_contiguous():
            raise RuntimeError("torch.empty_like of a broadcast tensor is not contiguous in this PyTorch")

        def make():
            t = torch.empty_like(like)
            return t, t.data_ptr()

        return make

    def make():
        o = empty_like(a, shape, dtype, va.framework)
        return o, describe(o)[1]

    return make
