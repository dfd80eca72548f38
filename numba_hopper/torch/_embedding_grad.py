"""An embedding's weight gradient in a compiled training graph, without a float32 table.

AOTAutograd decomposes ``embedding``'s backward into a float32 (V, H) table of zeros, the
looked-up rows' gradients added into it (``index_put`` with ``accumulate``), and a conversion of
the whole table to the weight's dtype. For a language model's vocabulary that is a pass over
hundreds of megabytes to compute a few thousand rows: at Qwen3-4B's widths (V = 151936, H =
2560) the table is 1.6 GB, written, read and converted each step. With tied embeddings the
table is then added to the output layer's weight gradient, one more pass over both.

Inductor's post-grad pass (``_post_grad.fuse_embedding_grads``) puts these operators in place
of that sequence, in graphs that hold numba_hopper's products:

- ``embedding_grad(ids, values, mask, rows, dtype)``: a table of zeros in the weight's dtype with
  the looked-up rows added (:func:`add_embedding_rows`; ``mask``: which lookups count, where
  the decomposition masks them);
- ``mm_embedding_grad(a, b, sustained, ids, values, mask)``: a tied weight's gradient, ``a @ b``
  (the output layer's product, in the training tiles when ``sustained``) with the rows added
  into it in place.

Each row that a lookup touched is rounded to the weight's dtype once: its float32 sum over the
lookups plus, for a tied weight, the product's value. (The decomposition rounds the table's row,
then rounds again when it adds the product's.)
"""

from __future__ import annotations

import torch

from ..kernels.embedding_grad import (SORT_CAPACITY, SORT_THREADS, THREADS, add_rows_kernel, column_spans,
                                      sort_lookups_kernel, sort_slots)
from . import ops
from ._launch import KERNEL_DTYPES, launch


def add_embedding_rows(out, ids, values, mask=None):
    """``out[i] += sum(values[j] for j where ids[j] == i)`` in place, for a (V, H) ``out``, integer
    ``ids`` of any shape and float32 ``values`` of shape ``ids.shape + (H,)``; where a boolean
    ``mask`` (one value per id) is False, that lookup adds nothing. The sums are float32 and
    each touched row of ``out`` is rounded once; repeated ids add in a fixed order (by
    position), so the result does not depend on the run. Nothing waits for the GPU. A 16-bit
    table on the GPU takes a sort and one kernel (``kernels.embedding_grad``); others, PyTorch's
    operators."""
    ids = ids.reshape(-1)
    values = values.reshape(ids.numel(), out.shape[1])
    if out.is_cuda and out.dtype in KERNEL_DTYPES and out.is_contiguous():
        n = ids.numel()
        if not (n and out.shape[1]):
            return out
        if mask is not None:  # (a masked lookup's id out of range: the kernel skips it)
            ids = torch.where(mask.reshape(-1), ids, -1)
        sorted_ids, order = _sorted_lookups(ids, out.shape[0])
        launch(add_rows_kernel(KERNEL_DTYPES[out.dtype]), out.device, (n, column_spans(out.shape[1])), THREADS,
               out.data_ptr(), out.shape[0], out.shape[1], sorted_ids, order, values.float().contiguous())
        return out
    if mask is not None:
        mask = mask.reshape(-1)
        ids, values = torch.where(mask, ids, 0), torch.where(mask[:, None], values, 0.0)
    order = ids.argsort(stable=True)
    sorted_ids = ids[order]
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    positions = torch.arange(ids.numel(), device=ids.device)
    segment = torch.where(first, positions, 0).cummax(0).values  # each sorted lookup's first position of its id
    sums = torch.zeros_like(values).index_put_((segment,), values[order], accumulate=True)
    rows = (out.index_select(0, sorted_ids).float() + sums.index_select(0, segment)).to(out.dtype)
    out.index_put_((sorted_ids,), rows)  # a repeated id writes its row's one value again
    return out


def _sorted_lookups(ids, rows):
    """``(sorted ids as int32, their positions)``: the lookups ``ids`` (a CUDA vector) sorted
    stably by id, in one CTA (``kernels.embedding_grad.sort_lookups_kernel``) where their keys fit 32
    bits and its shared memory, else by ``torch.sort``."""
    n = ids.numel()
    position_bits = max(1, (n - 1).bit_length())
    if n > SORT_CAPACITY or (rows << position_bits | (n - 1)) >= 0xFFFFFFFF:
        return torch.sort(ids.to(torch.int32), stable=True)
    sorted_ids, order = ids.new_empty(n, dtype=torch.int32), ids.new_empty(n, dtype=torch.int64)
    launch(sort_lookups_kernel(sort_slots(n)), ids.device, 1, SORT_THREADS, ids, rows, position_bits, sorted_ids, order)
    return sorted_ids, order


def _embedding_grad_impl(ids, values, mask, rows, dtype):
    return add_embedding_rows(values.new_zeros((rows, values.shape[-1]), dtype=dtype), ids, values, mask)


def _embedding_grad_fake(ids, values, mask, rows, dtype):
    return values.new_empty((rows, values.shape[-1]), dtype=dtype)


def _mm_embedding_grad_impl(a, b, sustained, ids, values, mask):
    return add_embedding_rows(ops._mm_impl(a, b, sustained), ids, values, mask)


def _mm_embedding_grad_fake(a, b, sustained, ids, values, mask):
    return a.new_empty((a.shape[0], b.shape[1]))


ops.define_op("embedding_grad", "(Tensor ids, Tensor values, Tensor? mask, int rows, ScalarType dtype) -> Tensor",
              _embedding_grad_impl, _embedding_grad_fake)
ops.define_op("mm_embedding_grad",
              "(Tensor a, Tensor b, bool sustained, Tensor ids, Tensor values, Tensor? mask) -> Tensor",
              _mm_embedding_grad_impl, _mm_embedding_grad_fake)
