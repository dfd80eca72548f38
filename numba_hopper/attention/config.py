"""The attention kernel's interface: its compile-time configuration, its shared-memory layout and
its run-time parameters.

- :class:`AttentionConfig`: what one kernel is compiled for (head dim, dtype, tile, ring depth,
  whether the consumers take turns and whether the output tile reuses Q's buffer);
  :func:`attention_config` gives the tuned one of a call, :func:`tuned_configs` all of them.
- :class:`AttentionParams`: the kernel's run-time arguments, one named record.

Everything that varies per call (causal or not, the causal alignment, sequence lengths, packed
variable-length batches, the log-sum-exp output) is a run-time parameter, so one kernel per
head dim and dtype serves every call, save head dim 64's short causal calls, which have their own
(:func:`attention_config`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

from ..kit.layouts import SmemPlan, operand_layout
from ..kit.pipeline import pipeline_barrier_bytes

__all__ = ["AttentionConfig", "AttentionParams", "attention_config", "tuned_configs", "argument_types", "HEAD_DIMS",
           "DTYPES", "WG_ROWS"]

HEAD_DIMS = (64, 128, 256)
DTYPES = ("bf16", "f16")
WG_ROWS = 64  # query rows per consumer warpgroup (wgmma M)
SHORT_CAUSAL_64 = 1536  # head dim 64: causal calls of fewer queries take 128-row tiles
SWIZZLE = 128  # every tile: 128-byte swizzled rows of 64 16-bit elements


@dataclass(frozen=True)
class AttentionConfig:
    """Compile-time configuration of one attention kernel (:func:`attention_config` picks one per call).

    ``consumers``: consumer warpgroups, each 64 rows of the query tile (``block_m`` rows).
    ``block_n``: keys per K/V block (a multiple of 16: the P @ V wgmma's k16 steps). ``stages``:
    slots of each of the K and V rings. ``take_turns``: the consumer warpgroups issue their
    wgmmas in turns (named barriers), so that one's softmax runs while the other's GEMMs keep
    the tensor cores busy (FlashAttention-3's inter-warpgroup overlap). ``o_aliases_q``: the
    output tile is staged in Q's buffer (head dim 256, where shared memory has no room for
    both): the next tile's Q then loads once the output's TMA store has read it. Otherwise
    ``early_q_release``: the consumers release Q's buffer once their last S = Q K^T is done, so
    the next tile's Q loads under the last P V and the epilogue (else after the last P V).
    ``producer_regs``: registers the producer warpgroup keeps after ``setmaxnreg.dec``; the
    consumers share the rest. ``exp2_fma_eighths``: eighths of the softmax's exponentials
    computed by a cubic on the FMA pipe rather than the MUFU
    (:func:`numba_hopper.intrinsics.ex2_fma`); 0 in every tuned configuration, where it
    measured no faster (the authoring guide's attention page says why).
    """

    head_dim: int = 128
    dtype: str = "bf16"
    consumers: int = 2
    block_n: int = 128
    stages: int = 2
    take_turns: bool = True
    o_aliases_q: bool = False
    early_q_release: bool = True
    producer_regs: int = 24
    exp2_fma_eighths: int = 0

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}; got {self.head_dim}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}; got {self.dtype!r}")
        if self.consumers not in (2, 3):
            raise ValueError(f"consumers must be 2 or 3; got {self.consumers}")
        if self.block_n % 16 or not 16 <= self.block_n <= 256:
            raise ValueError(f"block_n must be a multiple of 16 in [16, 256]; got {self.block_n}")
        if not 0 <= self.exp2_fma_eighths <= 8:
            raise ValueError(f"exp2_fma_eighths must be in [0, 8]; got {self.exp2_fma_eighths}")
        self.smem  # raises if the buffers do not fit

    @property
    def block_m(self) -> int:
        """Query rows per tile: 64 per consumer warpgroup."""
        return WG_ROWS * self.consumers

    @property
    def threads(self) -> int:
        """The producer warpgroup and the consumers."""
        return 128 * (1 + self.consumers)

    # --- operand tiles (numba_hopper.kit.layouts) --------------------------------------------

    @property
    def q(self):
        """Q's tile: ``block_m`` rows, K-major (the A operand of S = Q K^T), D/64 boxes."""
        return operand_layout("K", SWIZZLE, self.dtype, self.block_m, self.head_dim)

    @property
    def k(self):
        """A K tile: ``block_n`` keys, K-major (B of S = Q K^T: its N is the keys)."""
        return operand_layout("K", SWIZZLE, self.dtype, self.block_n, self.head_dim)

    @property
    def v(self):
        """A V tile: ``block_n`` keys of D values, MN-major (B of O = P V: N is the head dim,
        contiguous in memory; the wgmma transposes it)."""
        return operand_layout("MN", SWIZZLE, self.dtype, self.head_dim, self.block_n)

    @property
    def o(self):
        """The output tile, staged for its TMA store in Q's layout (each consumer's 64 rows of
        every 64-column box: the TMA store box is ``(64, 64)``)."""
        return self.q

    @property
    def boxes(self) -> int:
        """64-column boxes per row of Q, K, V and O."""
        return self.head_dim // 64

    @functools.cached_property
    def smem(self) -> SmemPlan:
        plan = SmemPlan()
        plan.add("q", self.q.tile_bytes, self.q.alignment)
        plan.add("k", self.stages * self.k.tile_bytes, self.k.alignment)
        plan.add("v", self.stages * self.v.tile_bytes, self.v.alignment)
        if not self.o_aliases_q:
            plan.add("o", self.o.tile_bytes, self.o.alignment)
        plan.add("k_bars", pipeline_barrier_bytes(self.stages), 8)
        plan.add("v_bars", pipeline_barrier_bytes(self.stages), 8)
        plan.add("q_bars", 16, 8)  # q_full, q_empty
        plan.add("pin", 8, 8)  # the pinned wgmma wait's store (numba_hopper.kit.overlap)
        return plan

    @property
    def o_offset(self) -> int:
        return self.smem.offsets["q" if self.o_aliases_q else "o"]

    @property
    def shared_bytes(self) -> int:
        return self.smem.size

    @property
    def consumer_regs(self) -> int:
        """Registers of a consumer thread after ``setmaxnreg.inc``: the launch gives each thread
        65536 / ``threads`` (rounded down to 8); the producer's spare ones go to the consumers."""
        at_launch = 65536 // self.threads // 8 * 8
        return (at_launch * self.threads // 128 - self.producer_regs) // self.consumers // 8 * 8


def attention_config(head_dim: int, dtype: str = "bf16", causal: bool = False,
                     seqlen_q: int | None = None) -> AttentionConfig:
    """The tuned configuration of a call (FlashAttention-3's tiles, ``hopper/tile_size.h``).

    - 64: 192 x 128 tiles (three consumer warpgroups of 160 registers), three K and V slots.
      Causal calls of fewer than :data:`SHORT_CAUSAL_64` queries (``seqlen_q``, the longest
      sequence's when packed) take 128 x 128 tiles with Q released after the last P V: a
      192-row tile straddles two masked K blocks on the diagonal where a 128-row one has one,
      and pads more of its last tile (12% faster at 1k tokens, 2% at 1.25k; from 1.5k on the
      192-row tiles are 5-17% faster).
    - 128: 128 x 128 tiles, two slots each: Q 32 KB, K and V 128 KB, O 32 KB.
    - 256: 128 x 80 tiles, two slots each: Q 64 KB and K/V 160 KB fill shared memory, so the
      output is staged in Q's buffer; the consumers do not take turns (as FlashAttention-3,
      whose 256 kernel keeps each warpgroup's own overlap only).
    """
    if head_dim == 64:
        if causal and seqlen_q is not None and seqlen_q < SHORT_CAUSAL_64:
            return AttentionConfig(64, dtype, block_n=128, stages=3, early_q_release=False)
        return AttentionConfig(64, dtype, consumers=3, block_n=128, stages=3)
    if head_dim == 128:
        return AttentionConfig(128, dtype, block_n=128, stages=2)
    if head_dim == 256:
        return AttentionConfig(256, dtype, block_n=80, stages=2, take_turns=False, o_aliases_q=True)
    raise ValueError(f"head_dim must be one of {HEAD_DIMS}; got {head_dim}")


def tuned_configs(dtypes=DTYPES, head_dims=HEAD_DIMS) -> list[AttentionConfig]:
    """Every configuration :func:`attention_config` gives for these dtypes and head dims."""
    calls = ((d, t, causal, seqlen) for t in dtypes for d in head_dims
             for causal, seqlen in ((False, None), (True, 1)))
    return list(dict.fromkeys(attention_config(*call) for call in calls))


class AttentionParams(NamedTuple):
    """The attention kernel's run-time arguments (numba passes each field as its own parameter).

    ``maps``: tensor maps of Q, K, V and O, passed by value, each over a 4-D view (head dim,
    rows, heads, batches: innermost first) with 128-byte swizzle; boxes ``(1, 1, block_m, 64)``
    for Q, ``(1, 1, block_n, 64)`` for K and V, ``(1, 1, 64, 64)`` for O (numpy order). A packed
    variable-length batch is one "batch" of ``total`` rows, each sequence starting at its
    offset in ``cu_seqlens_q`` / ``cu_seqlens_k`` (device addresses of ``batch + 1`` int32;
    0 for a dense batch, whose sequences are ``seqlen_q`` and ``seqlen_k`` long).

    ``heads``: query heads; ``kv_group``: query heads per K/V head (GQA). The walk
    (:mod:`.scheduler`): ``m_blocks`` query tiles per (batch, head) (of ``max_seqlen_q`` rows
    for a packed batch) in ``pair_items`` work items, taken in ``section``s of that many
    (batch, head) pairs; ``positions``: twice the work items. ``schedule``: the device address
    of a balanced schedule's uint32 table (0: the walk above), which then sets ``positions``
    (twice its rows, less the last, times the grid). ``causal``: 0 or 1; ``bottom_right``: the
    causal diagonal ends at the last key (query i sees keys <= i + seqlen_k - seqlen_q), else at
    the first (keys <= i).
    ``scale_log2``: the softmax scale times log2(e); ``scale``: the scale (for the log-sum-exp).

    ``out`` (bytes) and its element strides: where a tile that ends inside its sequence of a
    packed batch stores its rows without TMA. ``lse``: the device address of float32
    log-sum-exps (0: none), element ``batch * lse_batch + head * lse_head + row`` (``row``
    counted from the packed batch's start).
    """

    maps: tuple
    batch: int
    heads: int
    kv_group: int
    seqlen_q: int
    seqlen_k: int
    cu_seqlens_q: int
    cu_seqlens_k: int
    m_blocks: int
    pair_items: int
    positions: int
    section: int
    schedule: int
    causal: int
    bottom_right: int
    scale_log2: float
    scale: float
    out: int
    out_row: int
    out_head: int
    out_batch: int
    lse: int
    lse_batch: int
    lse_head: int


def argument_types(cfg: AttentionConfig) -> tuple:
    """The numba types of the kernel's arguments ``(params,)`` as the host passes them."""
    from numba.cuda import types

    from ..runtime.tensormap import TENSORMAP_ARG

    special = {"maps": types.UniTuple(TENSORMAP_ARG, 4), "scale_log2": types.float32, "scale": types.float32}
    fields = tuple(special.get(f, types.int64) for f in AttentionParams._fields)
    return (types.NamedTuple(fields, AttentionParams),)


def l2_section(heads_total: int, seqlen_k: int, head_dim: int, kv_group: int, element_bytes: int = 2) -> int:
    """(batch, head) pairs per causal scheduling section: as many as keep their K and V within
    32 MB of L2, rounded down to a power of two (FlashAttention-3's swizzle), times the query
    heads that share a K/V head."""
    per_kv_head = max(1, seqlen_k) * 2 * head_dim * element_bytes
    fit = max(1, (32 << 20) // per_kv_head)
    return max(1, min(heads_total, (1 << int(math.log2(fit))) * kv_group))
