"""Inductor's lowering of ``numba_hopper::mm``, ``mm_sum`` and ``gated_mm``: the compiled graph's
wrapper calls ``numba_hopper.gemm(a, b, out=buf)`` (or ``gemm_sum``) itself, as it calls
``extern_kernels.mm(a, b, out=buf)`` for ``aten.mm``, instead of calling the operator through the
dispatcher. With them comes Inductor's ``post_grad_custom_pre_pass`` (``_post_grad.PostGradPass``,
after any pass the user had set there): it puts ``mm`` in place of each plain product that a
training graph holds as ``numba_hopper::gemm`` (the forward's linears and the backward's ``dX``
and ``dW``, which the autograd formula issues as ``gemm``), puts ``mm_sum`` in place of sums of
them, then fuses gated MLPs. The pass's ``numba_hopper::materialized`` is lowered to its input
realized: a buffer, which its readers load.

Why: a compiled forward issues each GEMM from Inductor's Python wrapper, and through the
dispatcher a Python-implemented operator costs more than the GEMM call itself (an H100 host, a
4096 x 2048 x 2048 product: the operator 25.5 us a call, this direct call 16.6, Inductor's
``extern_kernels.mm(out=)`` 19.3). Where the host trails the GPU (a forward's first kernels),
that is the forward's time (``python benchmarks/profile_compiled.py``).

The lowering uses Inductor's internals (``register_lowering``, ``ExternKernelChoice``); PyTorch
has no public way to lower a custom operator to a Python call. It is registered the first time
the operator's fake implementation runs (Dynamo and AOTAutograd run it before Inductor lowers the
graph), so that ``import numba_hopper.torch`` does not import Inductor (about 2 s). A C++ wrapper
(AOTInductor, ``cpp_wrapper``) cannot call Python, so there the graph keeps the operator.
"""

from __future__ import annotations

import torch

from ..matmul import api as _matmul
from ..matmul.heuristics import SUSTAINED

_registered = False


def numba_hopper_mm(a, b, *, sustained, out):
    """The extern kernel: ``out = a @ b`` into Inductor's buffer (``sustained``: a training
    graph's product, in ``gemm(config="sustained")``'s tiles)."""
    _matmul.gemm(a, b, out=out, config=SUSTAINED if sustained else None)


def numba_hopper_mm_sum(*operands, sustained, out):
    """The extern kernel: ``out = a_0 @ b_0 + a_1 @ b_1 + ...`` into Inductor's buffer, for
    ``operands = (a_0, a_1, ..., b_0, b_1, ...)``."""
    n = len(operands) // 2
    _matmul.gemm_sum(tuple(zip(operands[:n], operands[n:])), out=out, config=SUSTAINED if sustained else None)


def numba_hopper_gated_mm(a, b, up, *, activation, out):
    """The extern kernel: ``out = activation(a @ b) * (a @ up)`` into Inductor's buffer."""
    _matmul.gemm(a, b, up=up, activation=activation, out=out)


def register():
    """Lower ``numba_hopper::mm`` to :func:`numba_hopper_mm` (once per process)."""
    global _registered
    if _registered:
        return
    from torch._inductor.kernel.mm_common import mm_args
    from torch._inductor.lowering import fallback_handler, register_lowering
    from torch._inductor.select_algorithm import ExternKernelChoice
    from torch._inductor import config
    from torch._inductor.virtualized import V

    from ._post_grad import PostGradPass

    op, gated_op = torch.ops.numba_hopper.mm.default, torch.ops.numba_hopper.gated_mm.default
    sum_op = torch.ops.numba_hopper.mm_sum.default
    kernel = ExternKernelChoice(numba_hopper_mm)  # generated code calls extern_kernels.numba_hopper_mm
    gated_kernel = ExternKernelChoice(numba_hopper_gated_mm)
    sum_kernel = ExternKernelChoice(numba_hopper_mm_sum)
    call_operator = fallback_handler(op, add_to_fallback_set=False)
    call_gated_operator = fallback_handler(gated_op, add_to_fallback_set=False)
    call_sum_operator = fallback_handler(sum_op, add_to_fallback_set=False)

    @register_lowering(op, type_promotion_kind=None)
    def lower(a, b, sustained):
        if V.graph.cpp_wrapper:
            return call_operator(a, b, sustained)
        *_, layout, a, b = mm_args(a, b)  # a row-major (M, N) output buffer
        return kernel.bind((a, b), layout, sustained=sustained).output_node()

    @register_lowering(gated_op, type_promotion_kind=None)
    def lower_gated(a, b, up, activation):
        if V.graph.cpp_wrapper:
            return call_gated_operator(a, b, up, activation)
        *_, layout, a, b = mm_args(a, b)
        return gated_kernel.bind((a, b, up), layout, activation=activation).output_node()

    @register_lowering(sum_op, type_promotion_kind=None)
    def lower_sum(a, b, sustained):
        if V.graph.cpp_wrapper:
            return call_sum_operator(a, b, sustained)
        pairs = [mm_args(x, y) for x, y in zip(a, b)]
        layout = pairs[0][3]
        return sum_kernel.bind((*(p[4] for p in pairs), *(p[5] for p in pairs)), layout,
                               sustained=sustained).output_node()

    @register_lowering(torch.ops.numba_hopper.materialized.default, type_promotion_kind=None)
    def lower_materialized(x):
        x.realize()  # a buffer its readers load, where Inductor would inline its computation
        return x

    if not isinstance(config.post_grad_custom_pre_pass, PostGradPass):
        config.post_grad_custom_pre_pass = PostGradPass(then=config.post_grad_custom_pre_pass)
    _registered = True
