"""The FlashAttention-3-style forward kernel for sm_90a: warp-specialized, persistent, TMA + wgmma.

One CTA per SM, a producer warpgroup and ``cfg.consumers`` (two or three) consumers
(:mod:`numba_hopper.kit.warpspec`):

- warpgroup 0, the producer, gives registers back (``setmaxnreg.dec``); one elected thread
  walks the CTA's tiles (:mod:`.scheduler`) and loads, per tile, Q once and the K and V blocks
  into their two rings (:mod:`.mainloop`);
- the consumers take the registers (``setmaxnreg.inc``) and each computes 64 rows of the
  ``cfg.block_m``-row query tile: ``S = Q K^T``, the online softmax (:mod:`.softmax`) and
  ``O += P V`` with P kept in registers, the softmax of a block under the P V wgmmas of the
  block before it, and with ``cfg.take_turns`` the warpgroups' wgmmas in turns. Then the
  epilogue (:mod:`.epilogue`) stores the normalized rows with TMA (and their log-sum-exps).

:func:`make_attention_kernel` builds (and caches) the kernel of a :class:`AttentionConfig`; its
one argument is an :class:`AttentionParams`. The kernel only orchestrates the modules above.
"""

from __future__ import annotations

import functools

from numba import cuda

from .. import intrinsics as nh
from ..intrinsics.opaque import opaque_u32
from ..kit.barriers import NamedBarriers, make_ordered_barrier
from ..kit.pipeline import pipeline_start
from ..kit.warpspec import warp_specialization
from .config import AttentionConfig
from .epilogue import make_epilogue
from .mainloop import make_mainloop
from .scheduler import make_scheduler

__all__ = ["make_attention_kernel", "warp_split"]


def warp_split(cfg: AttentionConfig):
    """The kernel's producer/consumer split (threads, registers after ``setmaxnreg``)."""
    return warp_specialization(consumers=cfg.consumers, producer_regs=cfg.producer_regs)


@functools.lru_cache(maxsize=None)
def make_attention_kernel(cfg: AttentionConfig):
    """The ``@cuda.jit`` kernel ``attention_kernel(params)`` of ``cfg``."""
    CONSUMERS = cfg.consumers
    ids = NamedBarriers()
    EPILOGUE = ids.allocate("epilogue", CONSUMERS)  # one per consumer warpgroup
    turns = make_ordered_barrier(ids.allocate("turns", CONSUMERS), members=CONSUMERS)
    ws = warp_split(cfg)
    scheduler, mainloop, epilogue = make_scheduler(cfg), make_mainloop(cfg, turns), make_epilogue(cfg)
    OFF = cfg.smem.offsets
    K_BARS, V_BARS, Q_FULL, Q_EMPTY = OFF["k_bars"], OFF["v_bars"], OFF["q_bars"], OFF["q_bars"] + 8
    # q_empty: a consumer warp's lane 0 once its wgmmas are done with Q, or (Q's buffer staging
    # the output) each consumer's leader once the output's TMA store has read it
    Q_READERS = CONSUMERS if cfg.o_aliases_q else 4 * CONSUMERS
    TAKE_TURNS = cfg.take_turns

    @cuda.jit(device=True, forceinline=True)
    def tensormaps(p):
        return (nh.tensormap_param_address(p.maps[0]), nh.tensormap_param_address(p.maps[1]),
                nh.tensormap_param_address(p.maps[2]), nh.tensormap_param_address(p.maps[3]))

    @cuda.jit(device=True, forceinline=True)
    def init(args):
        p, smem = args
        maps = tensormaps(p)
        for i in range(4):
            nh.prefetch_tensormap(maps[i])
        mainloop.k_ring.init(smem + K_BARS)
        mainloop.v_ring.init(smem + V_BARS)
        nh.mbarrier_init(smem + Q_FULL, 1)
        nh.mbarrier_init(smem + Q_EMPTY, Q_READERS)

    @cuda.jit(device=True, forceinline=True)
    def producer(args):
        p, smem = args
        if cuda.threadIdx.x < 32 and nh.elect_sync():
            maps = tensormaps(p)
            st_k, st_v = pipeline_start(), pipeline_start()
            q_phase = 0
            pos = scheduler.first()
            entry = scheduler.fetch(p, pos)
            while pos < p.positions:
                w = scheduler.work(p, pos, entry)
                pos = scheduler.next(p, pos)
                entry = scheduler.fetch(p, pos)
                if w.valid:
                    st_k, st_v = mainloop.load(maps, smem, w, st_k, st_v, q_phase)
                    q_phase ^= 1

    @cuda.jit(device=True, forceinline=True)
    def consumer(cw, t, args):
        p, smem = args
        maps = tensormaps(p)
        if TAKE_TURNS:
            turns.start(cw)
        st_k, st_v = pipeline_start(), pipeline_start()
        q_phase = 0
        pos = scheduler.first()
        entry = scheduler.fetch(p, pos)
        while pos < p.positions:
            w = scheduler.work(p, pos, entry)
            next_pos = scheduler.next(p, pos)
            next_entry = scheduler.fetch(p, next_pos)  # read now: its latency hides under this tile
            if w.valid:
                o, m, l, st_k, st_v = mainloop.consume(smem, w, cw, t, st_k, st_v, q_phase, p.scale_log2)
                # The epilogue's view of the tile, computed again rather than held in registers
                # through the mainloop (LLVM would reuse the first: the id goes through an opaque mov).
                w = scheduler.work(p, opaque_u32(pos), entry)
                epilogue.store(o, m, l, p, maps, smem, w, cw, t, EPILOGUE + cw)
                q_phase ^= 1
            pos, entry = next_pos, next_entry
        epilogue.drain(t)

    body = ws.body(init, producer, consumer)

    @cuda.jit(launch_bounds=ws.launch_bounds)
    def attention_kernel(p):
        body((p, nh.dynamic_shared_base()))

    return attention_kernel
