"""Attention for PyTorch: the ``numba_hopper::attention`` custom op, an SDPA drop-in and a
transformers attention backend.

- ``torch.ops.numba_hopper.attention(q, k, v, causal, causal_align, scale, cu_seqlens_q,
  cu_seqlens_k, max_seqlen_q, max_seqlen_k, bshd_out) -> (out, lse)``: a ``torch.library``
  operator over :func:`numba_hopper.attention` with a fake implementation, so ``torch.compile``
  and ``torch.export`` trace it without a graph break; it runs on PyTorch's current stream and
  never synchronizes, so CUDA graphs capture it (after a warm-up call, which compiles the
  kernel). ``bshd_out``: the dense output is allocated (batch, seq, heads, head_dim) and
  returned as its (batch, heads, seq, head_dim) view, the layout a transformers attention layer
  wants next (no transpose copy). Forward only: it has no autograd formula.
- :func:`scaled_dot_product_attention`: ``torch.nn.functional.scaled_dot_product_attention``'s
  signature and results, on the op where it applies, on torch otherwise.
- :func:`register_transformers_attention`: an attention function and a mask builder for
  transformers' ``AttentionInterface``, so ``attn_implementation="numba_hopper"`` routes a
  model's attention here.
"""

from __future__ import annotations

import torch

from ..attention import api as _api
from ..attention.config import HEAD_DIMS

__all__ = ["attention", "scaled_dot_product_attention", "register_transformers_attention", "attention_forward",
           "causal_mask", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "numba_hopper"
_SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool causal=False, str causal_align='bottom_right', float? scale=None, "
           "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, int? max_seqlen_q=None, int? max_seqlen_k=None, "
           "bool bshd_out=False) -> (Tensor, Tensor)")

_lib = torch.library.Library("numba_hopper", "FRAGMENT")
_lib.define("attention" + _SCHEMA)


def _out_for(q, cu_seqlens_q, bshd_out):
    if cu_seqlens_q is None and bshd_out:
        b, h, s, d = q.shape
        return q.new_empty((b, s, h, d)).transpose(1, 2)
    return None


def _impl(q, k, v, causal=False, causal_align="bottom_right", scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
          max_seqlen_q=None, max_seqlen_k=None, bshd_out=False):
    return _api.attention(q, k, v, causal=causal, causal_align=causal_align, scale=scale, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                          return_lse=True, out=_out_for(q, cu_seqlens_q, bshd_out))


def _fake(q, k, v, causal=False, causal_align="bottom_right", scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
          max_seqlen_q=None, max_seqlen_k=None, bshd_out=False):
    out = _out_for(q, cu_seqlens_q, bshd_out)
    if out is None:
        out = q.new_empty(q.shape)
    if cu_seqlens_q is None:
        lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, lse


for _key in ("CPU", "CUDA"):  # CPU tensors reach numba_hopper.attention, which refuses them with a TypeError
    _lib.impl("attention", _impl, _key)
torch.library.register_fake("numba_hopper::attention", _fake, lib=_lib)
_op = torch.ops.numba_hopper.attention.default


def attention(q, k, v, causal=False, causal_align="bottom_right", scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q=None, max_seqlen_k=None, bshd_out=False):
    """``numba_hopper::attention``: ``(out, lse)`` of :func:`numba_hopper.attention` (its docstring
    has the rules; ``lse`` always returned)."""
    return _op(q, k, v, causal, causal_align, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               bshd_out)


def _hopper(device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def _supported(query, key, value, attn_mask, dropout_p, scale, enable_gqa) -> bool:
    """Whether the op computes this SDPA call (else torch does): the docstring's conditions."""
    if attn_mask is not None or dropout_p != 0.0:
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if query.dtype not in (torch.bfloat16, torch.float16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if query.shape[-1] not in HEAD_DIMS or key.shape[-1] != query.shape[-1] or value.shape != key.shape:
        return False
    if query.shape[0] != key.shape[0] or not (query.device == key.device == value.device):
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads and not (enable_gqa and kv_heads > 0 and heads % kv_heads == 0):
        return False
    if scale is not None and not scale > 0:
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return False  # no backward here yet
    return _hopper(query.device)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` (same arguments and results) on
    numba_hopper's kernel where it applies:

    - ``attn_mask`` None and ``dropout_p`` 0;
    - 4-D (batch, heads, seq, head_dim) bf16 or fp16 CUDA tensors on a Hopper GPU, head dim 64,
      128 or 256, ``value`` shaped like ``key``;
    - ``is_causal`` aligned to the top left when ``seq_q != seq_k``, as SDPA;
    - ``scale`` positive or None (``1 / sqrt(head_dim)``);
    - ``enable_gqa``: key/value heads dividing the query heads;
    - no gradient needed (the op has no backward yet).

    Anything else (a mask, dropout, other ranks, dtypes or head dims, gradients, another GPU)
    falls back to ``torch.nn.functional.scaled_dot_product_attention``. Differences where both
    run: a query row that sees no key gives 0 here (torch: NaN); the softmax's exponential is
    ``ex2.approx`` (float32, about 2**-22 relative error), as FlashAttention's."""
    if not _supported(query, key, value, attn_mask, dropout_p, scale, enable_gqa):
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                                dropout_p=dropout_p, is_causal=is_causal,
                                                                scale=scale, enable_gqa=enable_gqa)
    return attention(query, key, value, bool(is_causal), "top_left", scale)[0]


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """A transformers attention function (``AttentionInterface``'s signature): ``query`` (batch,
    heads, seq, head_dim), ``key``/``value`` (batch, kv_heads, kv_seq, head_dim); returns the
    output as (batch, seq, heads, head_dim) and no attention weights. Causal as transformers'
    SDPA backend decides it (``module.is_causal`` unless ``is_causal`` is given, never for a
    single query or with a mask); calls with a mask or dropout, or that the kernel does not
    take, go to transformers' SDPA function."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1 and attention_mask is None
    if not _supported(query, key, value, attention_mask, dropout, scaling, True):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = attention(query, key, value, causal, "top_left", scaling, bshd_out=True)[0]
    return out.transpose(1, 2), None


def causal_mask(**kwargs):
    """A transformers mask builder (``AttentionMaskInterface``'s keywords): None for plain causal
    attention with no padding, which :func:`attention_forward` computes from ``is_causal``; else
    transformers' SDPA builder's mask.

    None on the conditions on which the SDPA builder leaves the mask out eagerly: no 2-D
    padding mask, a builder that allows the causal skip (not bidirectional, not packed), one
    query or as many queries as keys, and no local window (sliding, chunked) narrower than the
    keys. They are conditions on shapes, so they hold in a trace too, where the SDPA builder
    (transformers 5 on PyTorch before 2.14) builds the mask for every call, under
    ``torch.compile`` and CUDA graph capture alike: with a mask, the attention would never reach
    the kernel."""
    from transformers.masking_utils import sdpa_mask

    q_length, kv_length, local_size = kwargs["q_length"], kwargs["kv_length"], kwargs.get("local_size")
    if (kwargs.get("attention_mask") is None and kwargs.get("allow_is_causal_skip", True)
            and (q_length == 1 or q_length == kv_length) and (local_size is None or kv_length < local_size)):
        return None
    return sdpa_mask(**kwargs)


def register_transformers_attention(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register :func:`attention_forward` as transformers' attention implementation ``name``, with
    :func:`causal_mask` as its mask builder, so causal, unpadded batches reach the kernel,
    compiled and in CUDA graphs too; return ``name``. Then::

        model = AutoModelForCausalLM.from_config(config, attn_implementation="numba_hopper")
        # or, on a built model: model.set_attn_implementation("numba_hopper")

    Padded batches keep their mask and run on transformers' SDPA function."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(name, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, causal_mask)
    return name

