"""numba_hopper's operators on DTensors: the sharding rules tensor parallelism needs.

    import numba_hopper.torch as nht
    import numba_hopper.torch.distributed as nhd   # registers the rules with DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    nht.replace_linear(model)
    parallelize_module(model, mesh, nhd.decoder_tp_plan())   # or any Colwise/Rowwise plan

Importing this module registers a sharding rule with ``torch.distributed.tensor`` (its
``register_sharding``) for every ``numba_hopper`` operator: ``gemm``, ``gemm_aux``,
``gemm_no_grad``, ``mm``, ``gated_mm``, ``bmm``, ``bmm_no_grad`` and ``attention``
(``import numba_hopper.torch`` alone does not import ``torch.distributed.tensor``). A DTensor
is a tensor subclass, so :class:`~numba_hopper.torch.Linear` and the other
``numba_hopper.torch`` functions call the operators on it (as they do while tracing), and
DTensor runs each rank's kernel on that rank's shards: a ``ColwiseParallel`` weight is read in
place as the column block of B it is, a ``RowwiseParallel`` one as a block of K whose product
is a partial sum that the layer's all-reduce completes. The backward's products are the same
operators under the same rules, so no full weight is ever gathered.

A rule takes the inputs as they are placed; it never gathers, reduces or re-shards one. Where
the inputs' placements match a rule the kernel runs on the local shards; where they match one
once a replicated input is cut into shards or partial values (a slice or a division, no
communication), DTensor does that first; anything else raises :class:`PlacementError`, which
names the placements given and the rules, rather than all-gathering an operand behind the
plan's back. Choose the communication explicitly (a parallel style's ``input_layouts``,
``PrepareModuleInput``, ``DTensor.redistribute``). DTensor's dispatcher re-raises the error as
a RuntimeError whose message starts with ours (the original is its ``__cause__``).

The rules, on each mesh dimension (``R`` replicated, ``S(d)`` sharded on dim d, ``P`` a
partial sum; output <- inputs):

- ``gemm``, ``gemm_aux`` (both outputs), ``gemm_no_grad``, ``mm``: ``act(alpha a @ b + beta c
  + bias)``, a (M, K), b (K, N). ``R <- R, R``; rows ``S(0) <- S(0), R``; columns ``S(1) <- R,
  S(1)``; and, without an activation (the product is linear in each operand), K ``P <- S(1),
  S(0)``, ``P <- P, R`` and ``P <- R, P``. ``c`` is placed as the output; ``bias`` is sharded
  with the rows or columns it runs along and replicated across the others, and is ``P`` with a
  partial output (a replicated bias is divided among the ranks, as DTensor's ``addmm`` rule
  does). An activation of a partial sum has no rule: a row-wise layer takes no fused activation.
- ``gated_mm`` (``act(a @ b) * (a @ up)``): ``R``; rows of a; columns of b and up together.
- ``bmm`` ((B, M, K) x (B, K, N)): ``R``; batch ``S(0)`` (an operand whose batch of 1
  broadcasts stays ``R``); ``S(1)`` rows of a; ``S(2)`` columns of b; the ``P`` rules of ``gemm``.
- ``attention`` (q, k, v (B, H, S, D), or packed (total, H, D) with ``cu_seqlens``): ``R``;
  batch ``S(0)`` (not packed); heads ``S(1)`` of q, k and v, with the output's heads and
  ``lse``'s (dim 1, or 0 packed); ``cu_seqlens`` replicated. With fewer key/value heads than
  query heads, the key/value heads must split evenly into the head shards. The sequence is
  never split: each query's softmax spans all keys.

The local shards must be what the kernels take (bf16/fp16 CUDA tensors on a Hopper GPU), and
numba_hopper launches in the CUDA context current on the calling thread: in a process per GPU,
call ``torch.cuda.set_device(local_rank)`` before anything calls numba_hopper.
DTensors mixed with plain tensors, or on different meshes, raise DTensor's error; local
operands on different devices (through ``implicit_replication``) raise numba_hopper's
``DeviceMismatchError``, or a TypeError for a CPU tensor, before any launch.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from ..errors import NumbaHopperError
from . import attention as _attention  # noqa: F401  (defines numba_hopper::attention)
from . import ops as _ops  # noqa: F401  (defines the GEMM operators)

__all__ = ["PlacementError", "decoder_tp_plan"]

R, P = Replicate(), Partial()


class PlacementError(NumbaHopperError, ValueError):
    """DTensor arguments whose placements no sharding rule of the operator takes without
    communication."""


# --- the rules: [(output placements, {tensor argument: placement}), ...] on one mesh dimension


def _gemm_rules(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    rows, cols = Shard(0), Shard(1)
    along_rows = bias is not None and _bias_along_rows(bias, bias_dim, b.shape[1])
    bias_rows = rows if along_rows else R  # (a per-row bias is 1-D or (M, 1): rows are its dim 0)
    bias_cols = R if along_rows else Shard(bias.ndim - 1) if bias is not None else R
    rules = [((R,), dict(a=R, b=R, c=R, bias=R)),
             ((rows,), dict(a=rows, b=R, c=rows, bias=bias_rows)),
             ((cols,), dict(a=R, b=cols, c=cols, bias=bias_cols))]
    if activation is None:
        rules += [((P,), dict(a=Shard(1), b=Shard(0), c=P, bias=P)),
                  ((P,), dict(a=P, b=R, c=P, bias=P)),
                  ((P,), dict(a=R, b=P, c=P, bias=P))]
    return rules


def _bias_along_rows(bias, bias_dim, n):
    """Whether ``bias`` holds one value per row, as ``numba_hopper.gemm`` reads it: a 1-D bias
    per column unless ``bias_dim=0``; a 2-D one per column when it is (1, N), else per row."""
    return bias_dim == 0 if bias.ndim == 1 else tuple(bias.shape) != (1, n)


def _gemm_aux_rules(*args, **kwargs):
    return [(out * 2, inputs) for out, inputs in _gemm_rules(*args, **kwargs)]  # out and pre placed alike


def _mm_rules(a, b, sustained):
    return _gemm_rules(a, b)


def _gated_mm_rules(a, b, up, activation):
    return [((R,), dict(a=R, b=R, up=R)),
            ((Shard(0),), dict(a=Shard(0), b=R, up=R)),
            ((Shard(1),), dict(a=R, b=Shard(1), up=Shard(1)))]


def _bmm_rules(a, b, out_dtype=None):
    batch = Shard(0)
    return [((R,), dict(a=R, b=R)),
            ((batch,), dict(a=R if a.shape[0] < b.shape[0] else batch, b=R if b.shape[0] < a.shape[0] else batch)),
            ((Shard(1),), dict(a=Shard(1), b=R)),
            ((Shard(2),), dict(a=R, b=Shard(2))),
            ((P,), dict(a=Shard(2), b=Shard(1))),
            ((P,), dict(a=P, b=R)),
            ((P,), dict(a=R, b=P))]


def _attention_rules(q, k, v, causal=False, causal_align="bottom_right", scale=None, cu_seqlens_q=None,
                     cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, bshd_out=False):
    heads, kv_heads, pieces = q.shape[1], k.shape[1], _head_pieces(q, k, v)
    if kv_heads != heads and kv_heads % pieces:
        raise PlacementError(f"numba_hopper::attention: {kv_heads} key/value heads (for {heads} query heads) do not "
                             f"split evenly into the {pieces} head shards of q, k and v")
    packed, h = cu_seqlens_q is not None, Shard(1)
    seqlens = dict(cu_seqlens_q=R, cu_seqlens_k=R)
    rules = [((R, R), dict(q=R, k=R, v=R, **seqlens)),
             ((h, Shard(0) if packed else h), dict(q=h, k=h, v=h, **seqlens))]  # lse: (H, total) or (B, H, S)
    if not packed:
        rules.append(((Shard(0), Shard(0)), dict(q=Shard(0), k=Shard(0), v=Shard(0), **seqlens)))
    return rules


def _head_pieces(*specs):
    """How many pieces the heads (dim 1) of ``specs`` are cut into: the product of the sizes of
    the mesh dimensions on which any of them is sharded on its heads."""
    mesh = specs[0].mesh
    return math.prod(mesh.size(m) for m in range(mesh.ndim) if any(s.placements[m] == Shard(1) for s in specs))


_REDISTRIBUTE = "redistribute the inputs to one of them"


def _gemm_hint(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    if activation is not None:
        return (f"activation {activation!r} needs the complete sum over K, so K is not sharded: a row-wise "
                "layer takes no fused activation")
    return _REDISTRIBUTE


# operator -> (rules, tensor arguments, what to say when none applies: a string or a function of the arguments)
_RULES = {
    "gemm": (_gemm_rules, ("a", "b", "c", "bias"), _gemm_hint),
    "gemm_aux": (_gemm_aux_rules, ("a", "b", "c", "bias"), _gemm_hint),
    "gemm_no_grad": (_gemm_rules, ("a", "b", "c", "bias"), _gemm_hint),
    "mm": (_mm_rules, ("a", "b"), _REDISTRIBUTE),
    "gated_mm": (_gated_mm_rules, ("a", "b", "up"), "the gated product is nonlinear: K is not sharded"),
    "bmm": (_bmm_rules, ("a", "b"), _REDISTRIBUTE),
    "bmm_no_grad": (_bmm_rules, ("a", "b"), _REDISTRIBUTE),
    "attention": (_attention_rules, ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"),
                  "attention shards the batch or the heads, never the sequence or head_dim"),
}


# --- applying them ------------------------------------------------------------------------


def _free(current, target):
    """Whether DTensor makes ``current`` ``target`` without communication: the same, or a
    replicated tensor cut into shards (a slice) or partial values (a division)."""
    return current == target or (current.is_replicate() and (target.is_shard() or target.is_partial()))


def _show(placements):
    return ", ".join(f"{name}={p}" for name, p in placements.items())


def _usable(op_name, given, rules, hint):
    """The rules that the inputs ``given`` ({name: DTensorSpec}) reach without communication,
    on every mesh dimension (only those they match exactly, where some do)."""
    kept = []
    for m in range(next(iter(given.values())).mesh.ndim):
        here = {name: spec.placements[m] for name, spec in given.items()}
        exact = [r for r in rules if all(r[1][n] == p for n, p in here.items())]
        usable = exact or [r for r in rules if all(_free(p, r[1][n]) for n, p in here.items())]
        if not usable:
            known = "; ".join(f"{', '.join(map(str, out))} <- {_show(ins)}" for out, ins in rules)
            raise PlacementError(f"numba_hopper::{op_name} has no sharding rule for {_show(here)} on mesh "
                                 f"dimension {m} ({hint}). Its rules, output <- inputs: {known}")
        kept += [r for r in usable if r not in kept]
    return kept


def _register(op_name):
    rules_of, tensor_args, hint = _RULES[op_name]
    op = getattr(torch.ops.numba_hopper, op_name).default
    arg_names = [a.name for a in op._schema.arguments]

    def sharding(*args, **kwargs):
        named = dict(zip(arg_names, args), **kwargs)
        given = {n: named[n] for n in tensor_args if named.get(n) is not None}
        rules = [(out, {n: ins[n] for n in given}) for out, ins in rules_of(*args, **kwargs)]
        usable = _usable(op_name, given, rules, hint(*args, **kwargs) if callable(hint) else hint)
        return [(list(out), [ins.get(n) for n in arg_names]) for out, ins in usable]

    register_sharding(op)(sharding)


for _name in _RULES:
    _register(_name)


# --- a plan ---------------------------------------------------------------------------------


def decoder_tp_plan(layers: str = "model.layers.*") -> dict:
    """``parallelize_module``'s plan for the Llama-style decoder layers under ``layers``
    (transformers' Llama, Mistral, Qwen2, Qwen3: ``self_attn.{q,k,v,o}_proj`` and
    ``mlp.{gate,up,down}_proj``): the query, key, value, gate and up projections column-wise
    (each rank its heads and its slice of the MLP), the output and down projections row-wise
    (one all-reduce each in the forward). The attention's ``hidden_states`` and the MLP's input
    are made replicated DTensors, so the backward makes one all-reduce for each (not one per
    projection), and a fused :class:`~numba_hopper.torch.GatedMLP`, which reads its weights
    itself, runs its gated product on the shards. Attention runs on
    each rank's heads as plain local tensors, so the model must take its head count from the
    projections' outputs (``view(..., -1, head_dim)``, as transformers does), and the query and
    key/value head counts must divide by the mesh's size. Per-head query and key norms (Qwen3's
    ``self_attn.q_norm`` and ``k_norm``) run on each rank's heads with their whole weights, which
    stay plain tensors: the backward sums their gradients over the ranks (one all-reduce each),
    so every rank holds one GPU's gradient."""
    attention_input = {"hidden_states": R}  # (passed by keyword, as transformers' decoder layers do)
    return {
        f"{layers}.self_attn": _AttentionInput(input_kwarg_layouts=attention_input,
                                               desired_input_kwarg_layouts=attention_input, use_local_output=False),
        f"{layers}.self_attn.q_proj": ColwiseParallel(),
        f"{layers}.self_attn.k_proj": ColwiseParallel(),
        f"{layers}.self_attn.v_proj": ColwiseParallel(),
        f"{layers}.self_attn.o_proj": RowwiseParallel(),
        f"{layers}.mlp": PrepareModuleInput(input_layouts=(R,), desired_input_layouts=(R,), use_local_output=False),
        f"{layers}.mlp.gate_proj": ColwiseParallel(),
        f"{layers}.mlp.up_proj": ColwiseParallel(),
        f"{layers}.mlp.down_proj": RowwiseParallel(),
    }


_HEAD_NORMS = ("q_norm", "k_norm")  # per-head query and key norms (Qwen3)


class _AttentionInput(PrepareModuleInput):
    """``PrepareModuleInput`` for an attention module, whose per-head norms then see only the
    rank's heads: each of their parameters' gradients is a partial sum, summed over the mesh by
    a hook."""

    def _apply(self, module, device_mesh):
        for name in _HEAD_NORMS:
            norm = getattr(module, name, None)
            if norm is None:
                continue
            head_dim = getattr(module, "head_dim", None)
            weight = getattr(norm, "weight", None)
            if weight is not None and head_dim is not None and weight.shape[-1] != head_dim:
                raise ValueError(f"self_attn.{name} normalizes {weight.shape[-1]} features, not one head's "
                                 f"{head_dim}: a norm over all heads cannot run on a rank's heads")
            for param in norm.parameters():
                param.register_hook(functools.partial(_sum_over_ranks, mesh=device_mesh))
        return super()._apply(module, device_mesh)


def _sum_over_ranks(grad, mesh):
    return funcol.wait_tensor(funcol.all_reduce(grad, "sum", mesh))
