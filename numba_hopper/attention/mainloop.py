"""The attention mainloop: the producer's TMA loads of Q, K and V, and each consumer warpgroup's
``S = Q K^T`` / softmax / ``O += P V`` over a query tile's key blocks.

**Shared memory.** Q's 128 x D tile (loaded once per tile, ``q_full`` / ``q_empty`` mbarriers),
and two rings (:func:`numba_hopper.kit.pipeline.make_ring`) of ``stages`` slots, one of K
blocks and one of V blocks, each with its own barriers: ``S = Q K^T`` starts once K has
landed, whatever V does. Every tile is in boxes of 64 columns (128-byte swizzle); K is the
K-major B operand of ``Q K^T``, V the MN-major (transposed) B operand of ``P V``
(:mod:`numba_hopper.kit.layouts`).

**Producer** (one elected thread): per tile, the last key block's K, then Q (once the
consumers are done with the previous tile's, ``q_empty``), then K of block ``n`` and V of
block ``n + 1`` for ``n`` descending, and V of block 0: the order the consumers read them in.

**Consumers** (FlashAttention-3's intra-warpgroup overlap, ``mainloop_fwd_sm90_tma_gmma_ws.hpp``).
Key blocks run from the last to the first (masked blocks first, :mod:`.scheduler`). After the
first block's ``S`` and softmax, each step issues, as two wgmma groups::

    S_n = Q K_n^T                  (group 1: D/16 SS wgmmas into S's registers)
    O  += P_{n+1} V_{n+1}          (group 2: block_n/16 RS wgmmas; P in registers)
    wait_group(1)                  S_n is ready, the P V wgmmas still run
    softmax(S_n) -> P_n, corr      under the P V wgmmas
    wait_group(0)                  O is ready
    O *= corr; P_n packed to 16 bits

With ``cfg.take_turns`` the consumer warpgroups issue those groups in turns (an ordered
barrier, :func:`numba_hopper.kit.barriers.make_ordered_barrier`): one's softmax runs under the
other's wgmmas. The accumulator reads after each wait go through ``wgmma_fence_operand``, which
keeps LLVM from moving them above the wait (ptxas would then wait for every wgmma in flight
there: the overlap lost). The pack of ``P_n`` comes after ``wait_group(0)``: the P V wgmmas in
flight read ``P_{n+1}``'s registers, and a write into them would serialize the wgmmas.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from ..kit.fragments import a_operand, scale_rows
from ..kit.layouts import make_descriptors
from ..kit.overlap import make_wait_after
from ..kit.pipeline import make_ring
from .config import WG_ROWS, AttentionConfig
from .softmax import NEG_INF, make_mask, make_online_step

__all__ = ["Mainloop", "make_mainloop", "make_rings"]

Mainloop = namedtuple("Mainloop", ["k_ring", "v_ring", "load", "consume"])
Mainloop.__doc__ = """``make_mainloop(cfg)``: the rings and device functions ``load(maps, smem, w, st_k, st_v,
q_phase) -> (st_k, st_v)`` (the producer's elected thread, one tile) and ``consume(smem, w, cw, t,
st_k, st_v, q_phase, scale_log2) -> (o, m, l, st_k, st_v)`` (a consumer warpgroup, one tile)."""


def make_rings(cfg: AttentionConfig):
    """The K and V rings: one release per consumer warp (lane 0, after the wait that ends the
    wgmmas reading the slot)."""
    arrivals = 4 * cfg.consumers
    return (make_ring(cfg.stages, consumer_arrivals=arrivals, tx_bytes=cfg.k.tile_bytes),
            make_ring(cfg.stages, consumer_arrivals=arrivals, tx_bytes=cfg.v.tile_bytes))


def make_mainloop(cfg: AttentionConfig, turns) -> Mainloop:
    """The mainloop of ``cfg``'s kernel; ``turns``: the consumers' ordered barrier (used if
    ``cfg.take_turns``)."""
    T, BN, D, BOXES, BLOCK_M = cfg.dtype, cfg.block_n, cfg.head_dim, cfg.boxes, cfg.block_m
    K_RING, V_RING = make_rings(cfg)
    OFF = cfg.smem.offsets
    Q_OFF, K_OFF, V_OFF = OFF["q"], OFF["k"], OFF["v"]
    K_BARS, V_BARS, Q_FULL, Q_EMPTY = OFF["k_bars"], OFF["v_bars"], OFF["q_bars"], OFF["q_bars"] + 8
    PIN = OFF["pin"]
    Q_BYTES, Q_BOX, K_TILE, V_TILE = cfg.q.tile_bytes, cfg.q.box_bytes, cfg.k.tile_bytes, cfg.v.tile_bytes
    KV_BOX = cfg.k.box_bytes  # (V's boxes are as large: block_n rows of 64 columns)
    Q_WG = cfg.q.mn_offset(WG_ROWS)  # a consumer's 64 rows of Q
    QK_STEPS, PV_STEPS = cfg.q.k_steps, cfg.v.k_steps
    qd, kd, vd = make_descriptors(cfg.q), make_descriptors(cfg.k), make_descriptors(cfg.v)
    TAKE_TURNS, O_ALIASES_Q = cfg.take_turns, cfg.o_aliases_q
    EARLY_Q_RELEASE = cfg.early_q_release and not O_ALIASES_Q
    mask = make_mask(BN, BLOCK_M)
    online_step = make_online_step(cfg.exp2_fma_eighths)
    wait_after = make_wait_after(0)

    @cuda.jit(device=True, forceinline=True)
    def load_block(ring, bars, slots, tmap, st, w, n):
        """K or V of key block ``n`` into ring slot ``st``; the ring's next state."""
        full = ring.acquire(bars, st)
        slot = slots + st.stage * K_TILE
        for b in range(BOXES):
            nh.tma_load_4d(slot + b * KV_BOX, tmap, 64 * b, w.k_start + n * BN, w.kv_head, w.tma_batch, full)
        return ring.advance(st)

    @cuda.jit(device=True, forceinline=True)
    def load(maps, smem, w, st_k, st_v, q_phase):
        nb = w.n_blocks
        if nb > 0:
            st_k = load_block(K_RING, smem + K_BARS, smem + K_OFF, maps[1], st_k, w, nb - 1)
        nh.mbarrier_wait_parity(smem + Q_EMPTY, q_phase ^ 1)  # the consumers are done with Q's buffer
        nh.mbarrier_arrive_expect_tx(smem + Q_FULL, Q_BYTES)
        for b in range(BOXES):
            nh.tma_load_4d(smem + Q_OFF + b * Q_BOX, maps[0], 64 * b, w.q_start + w.m_block * BLOCK_M, w.head,
                           w.tma_batch, smem + Q_FULL)
        for i in range(nb - 1):
            st_k = load_block(K_RING, smem + K_BARS, smem + K_OFF, maps[1], st_k, w, nb - 2 - i)
            st_v = load_block(V_RING, smem + V_BARS, smem + V_OFF, maps[2], st_v, w, nb - 1 - i)
        if nb > 0:
            st_v = load_block(V_RING, smem + V_BARS, smem + V_OFF, maps[2], st_v, w, 0)
        return st_k, st_v

    @cuda.jit(device=True, forceinline=True)
    def qk_step(s, q_desc, k_desc, kk):
        return nh.wgmma_mma_async(s, qd.k_step(q_desc, kk), kd.k_step(k_desc, kk), 0 if kk == 0 else 1, T, T, 1, 1,
                                  0, 0)

    @cuda.jit(device=True, forceinline=True)
    def pv_step(o, packed, v_desc, kk):
        return nh.wgmma_mma_async_rs(o, a_operand(packed, kk), vd.k_step(v_desc, kk), 1, T, T, 1, 1, 1)

    qk_steps, pv_steps = _unrolled(qk_step, QK_STEPS), _unrolled(pv_step, PV_STEPS)

    @cuda.jit(device=True, forceinline=True)
    def qk(s, q_desc, k_desc):
        """Group 1: ``S = Q K^T`` on the slot at ``k_desc`` (S's old values are not read)."""
        s = qk_steps(s, q_desc, k_desc)
        nh.wgmma_commit_group()
        return s

    @cuda.jit(device=True, forceinline=True)
    def pv(o, packed, v_desc):
        """Group 2: ``O += P V`` on the slot at ``v_desc``, P from registers (RS)."""
        o = pv_steps(o, packed, v_desc)
        nh.wgmma_commit_group()
        return o

    @cuda.jit(device=True, forceinline=True)
    def release(ring, bars, st, t):
        if t % 32 == 0:
            ring.release(bars, st)

    @cuda.jit(device=True, forceinline=True)
    def step(s, packed, o, m, l, st_k, st_v, smem, descs, w, cw, t, n, scale_log2, masked):
        """Key block ``n``'s S and softmax under block ``n + 1``'s P V (module doc)."""
        K_RING.wait(smem + K_BARS, st_k)
        if TAKE_TURNS:
            turns.wait(cw)
        nh.wgmma_fence()
        s = qk(s, descs[0], kd.advance(descs[1], st_k.stage, K_TILE))
        V_RING.wait(smem + V_BARS, st_v)
        o = pv(o, packed, vd.advance(descs[2], st_v.stage, V_TILE))
        if TAKE_TURNS:
            turns.arrive(cw)
        nh.wgmma_wait_group(1)
        s = nh.wgmma_fence_operand(s)
        release(K_RING, smem + K_BARS, st_k, t)
        if masked:
            s = mask(s, w, cw, t, n)
        p, m, l, corr = online_step(s, m, l, scale_log2, masked)
        wait_after(smem + PIN, l[0], l[1])  # the wait stays after the softmax (kit.overlap)
        o = nh.wgmma_fence_operand(o)
        release(V_RING, smem + V_BARS, st_v, t)
        p = nh.wgmma_fence_operand(p)
        packed = nh.pack_tuple(p, T)
        o = scale_rows(o, corr)
        return p, packed, o, m, l, K_RING.advance(st_k), V_RING.advance(st_v)

    @cuda.jit(device=True, forceinline=True)
    def first_block(smem, descs, w, cw, t, st_k, scale_log2):
        """The last key block's S (waited for: nothing runs beside it) and softmax."""
        nb = w.n_blocks
        K_RING.wait(smem + K_BARS, st_k)
        nh.wgmma_fence()
        s = qk(nh.wgmma_accumulator(BN, "f32"), descs[0], kd.advance(descs[1], st_k.stage, K_TILE))
        nh.wgmma_wait_group(0)
        s = nh.wgmma_fence_operand(s)
        release(K_RING, smem + K_BARS, st_k, t)
        s = mask(s, w, cw, t, nb - 1)
        p, m, l, corr = online_step(s, (NEG_INF, NEG_INF), (np.float32(0), np.float32(0)), scale_log2, True)
        return p, nh.pack_tuple(p, T), m, l, K_RING.advance(st_k)

    @cuda.jit(device=True, forceinline=True)
    def consume(smem, w, cw, t, st_k, st_v, q_phase, scale_log2):
        descs = (qd.at(smem + Q_OFF + cw * Q_WG), kd.at(smem + K_OFF), vd.at(smem + V_OFF))
        o = nh.wgmma_accumulator(D, "f32")
        m = (NEG_INF, NEG_INF)
        l = (np.float32(0), np.float32(0))
        nh.mbarrier_wait_parity(smem + Q_FULL, q_phase)
        nb = w.n_blocks
        if nb > 0:
            s, packed, m, l, st_k = first_block(smem, descs, w, cw, t, st_k, scale_log2)
            # (32-bit counts: numba's 64-bit ones cost registers the consumers do not have)
            masked = max(np.int32(0), np.int32(w.n_masked - 1))
            for i in range(masked):
                s, packed, o, m, l, st_k, st_v = step(s, packed, o, m, l, st_k, st_v, smem, descs, w, cw, t,
                                                      np.int32(nb - 2 - i), scale_log2, True)
            for i in range(np.int32(nb - 1 - masked)):
                s, packed, o, m, l, st_k, st_v = step(s, packed, o, m, l, st_k, st_v, smem, descs, w, cw, t, 0,
                                                      scale_log2, False)
        if EARLY_Q_RELEASE and t % 32 == 0:
            # Every S = Q K^T is done (each block's wgmmas were waited for): the next tile's Q
            # loads under the last P V and the epilogue.
            nh.mbarrier_arrive(smem + Q_EMPTY)
        if nb > 0:
            V_RING.wait(smem + V_BARS, st_v)
            nh.wgmma_fence()
            o = pv(o, packed, vd.advance(descs[2], st_v.stage, V_TILE))
            nh.wgmma_wait_group(0)
            o = nh.wgmma_fence_operand(o)
            release(V_RING, smem + V_BARS, st_v, t)
            st_v = V_RING.advance(st_v)
        if not O_ALIASES_Q and not EARLY_Q_RELEASE and t % 32 == 0:
            nh.mbarrier_arrive(smem + Q_EMPTY)  # this warp's wgmmas no longer read Q
        return o, m, l, st_k, st_v

    return Mainloop(K_RING, V_RING, load, consume)


def _unrolled(step, n):
    """``run(acc, x, y)``: ``acc = step(acc, x, y, kk)`` for ``kk = 0 .. n - 1`` in order, each
    ``kk`` a compile-time constant. A loop would do, but LLVM leaves a 16-step loop over a
    128-register accumulator (head dim 256) rolled, and ptxas then fences every wgmma and pads
    each group with an empty one."""

    @cuda.jit(device=True, forceinline=True)
    def run(acc, x, y):
        return acc

    for kk in range(n):
        run = _then(run, step, kk)
    return run


def _then(run, step, kk):
    @cuda.jit(device=True, forceinline=True)
    def more(acc, x, y):
        return step(run(acc, x, y), x, y, kk)

    return more
