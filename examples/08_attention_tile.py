"""Attention for one head, a 64-row query tile per CTA: O = softmax(Q K^T / sqrt(d)) V, online.

Q (L, 64), K (S, 64), V (S, 64) and O (L, 64) are row-major bf16. The kit parts beyond the
GEMM's are the register fragments and fast math:

- a producer warpgroup loads Q once, then K and V blocks of 64 keys into two independent
  rings (``make_ring`` twice, each with its own barriers), so ``Q K^T`` of a block starts as
  soon as its K landed, whatever its V does;
- the consumer warpgroup computes ``S = Q K_j^T`` (SS wgmma, both K-major), masks the keys
  past ``S``'s end (``mask_cols``: TMA filled them with zeros), and runs the online softmax
  on the accumulator's registers: ``row_max`` (a thread's registers of each of its two rows,
  then its quad), ``exp2_rows`` (one FFMA and one ``ex2.approx.ftz`` each: ``-inf`` gives 0
  without a ``fastmath`` kernel), ``row_sum``, ``scale_rows`` for the output;
- ``P`` goes to bf16 A registers of the next wgmma in one step, ``pack_tuple(p, "bf16")``,
  before any of its wgmmas (converting between them serializes the wgmmas), and ``P V_j``
  runs as four RS wgmmas (``a_operand(packed, kk)``: accumulator pair ``8kk + 2m, +1`` is A
  register ``m`` of k16 slice ``kk``), V N-major with the transpose bit;
- ``O / l`` (``rcp.approx.ftz``) leaves through the kit's TMA-store epilogue.

Each block here waits for its own wgmmas; overlapping one block's softmax with the next's
wgmmas (FlashAttention-3) is left to the attention kernel.

    python examples/08_attention_tile.py             # on a Hopper GPU
    python examples/08_attention_tile.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import math

import numpy as np
from numba import cuda
from numba.cuda import types

from numba_hopper import intrinsics as nh
from numba_hopper.kit import (NamedBarriers, SmemPlan, a_operand, exp2_rows, make_descriptors, make_mma, make_ring,
                              make_tile_loads, make_tile_store, mask_cols, operand_layout, row_max, row_sum,
                              scale_rows, warp_specialization)
from numba_hopper.kit.host import TENSORMAP_ARG, launch, operand_tensor_map, tensor_map_arg
from numba_hopper.tools.cli import run_example

D, BLOCK = 64, 64  # head dim; query rows per CTA and keys per block
Q = operand_layout("K", 128, "bf16", mn=BLOCK, k=D)  # A of Q K^T
KT = operand_layout("K", 128, "bf16", mn=BLOCK, k=D)  # B of Q K^T: K's rows, d contiguous
V = operand_layout("MN", 128, "bf16", mn=D, k=BLOCK)  # B of P V: 64 keys (K) x 64 of d (N), d contiguous
WS = warp_specialization(consumers=1)
Q_RING = make_ring(1, consumer_arrivals=1, tx_bytes=Q.tile_bytes)
K_RING = make_ring(2, consumer_arrivals=4, tx_bytes=KT.tile_bytes)
V_RING = make_ring(2, consumer_arrivals=4, tx_bytes=V.tile_bytes)
QK = make_mma(Q, KT)
Q_DESC, K_DESC, V_DESC = make_descriptors(Q), make_descriptors(KT), make_descriptors(V)
V_TNSP = V.tnsp  # (a module-level int is a compile-time constant, as the RS wgmma's transpose bit must be)
Q_LOADS, K_LOADS, V_LOADS = make_tile_loads(Q), make_tile_loads(KT), make_tile_loads(V)
STORE = make_tile_store(D, "bf16", buffers=1)
EPI = NamedBarriers().allocate("epilogue")
SCALE = np.float32(math.log2(math.e) / math.sqrt(D))  # softmax scale, in base 2
NEG_INF = np.float32(-np.inf)

PLAN = SmemPlan()
Q_TILE = PLAN.add("q", Q.tile_bytes, 1024)
K_SLOTS = PLAN.add("k", 2 * KT.tile_bytes, 1024)
V_SLOTS = PLAN.add("v", 2 * V.tile_bytes, 1024)
OUT = PLAN.add("out", STORE.buffer_bytes, 1024)
Q_BARS = PLAN.add("q barriers", Q_RING.barrier_bytes, 8)
K_BARS = PLAN.add("k barriers", K_RING.barrier_bytes, 8)
V_BARS = PLAN.add("v barriers", V_RING.barrier_bytes, 8)


@cuda.jit(device=True, forceinline=True)
def init(args):
    smem = nh.dynamic_shared_base()
    Q_RING.init(smem + Q_BARS)
    K_RING.init(smem + K_BARS)
    V_RING.init(smem + V_BARS)


@cuda.jit(device=True, forceinline=True)
def producer(args):
    map_q, map_k, map_v, _, S = args
    if cuda.threadIdx.x < 32 and nh.elect_sync():
        smem = nh.dynamic_shared_base()
        full = Q_RING.acquire(smem + Q_BARS, Q_RING.start())
        Q_LOADS.load(smem + Q_TILE, nh.tensormap_param_address(map_q), cuda.blockIdx.x * BLOCK, 0, full)
        k_st, v_st = K_RING.start(), V_RING.start()
        for j in range(np.int32((S + BLOCK - 1) // BLOCK)):
            full = K_RING.acquire(smem + K_BARS, k_st)
            K_LOADS.load(smem + K_SLOTS + k_st.stage * KT.tile_bytes, nh.tensormap_param_address(map_k), j * BLOCK, 0,
                         full)
            full = V_RING.acquire(smem + V_BARS, v_st)
            V_LOADS.load(smem + V_SLOTS + v_st.stage * V.tile_bytes, nh.tensormap_param_address(map_v), 0, j * BLOCK,
                         full)
            k_st, v_st = K_RING.advance(k_st), V_RING.advance(v_st)


@cuda.jit(device=True, forceinline=True)
def consumer(cw, t, args):
    _, _, _, map_o, S = args
    smem = nh.dynamic_shared_base()
    q_desc, k0, v0 = Q_DESC.at(smem + Q_TILE), K_DESC.at(smem + K_SLOTS), V_DESC.at(smem + V_SLOTS)
    Q_RING.wait(smem + Q_BARS, Q_RING.start())
    m, l = (NEG_INF, NEG_INF), (np.float32(0), np.float32(0))
    o = nh.wgmma_fence_operand(nh.wgmma_accumulator(D, "f32"))
    k_st, v_st = K_RING.start(), V_RING.start()
    for j in range(np.int32((S + BLOCK - 1) // BLOCK)):
        K_RING.wait(smem + K_BARS, k_st)
        s = QK.k_block(QK.accumulator(), q_desc, K_DESC.advance(k0, k_st.stage, KT.tile_bytes), True)
        nh.wgmma_wait_group(0)
        s = mask_cols(nh.wgmma_fence_operand(s), t, S - j * BLOCK, NEG_INF)
        if t % 32 == 0:
            K_RING.release(smem + K_BARS, k_st)
        m_new = row_max(s, m)  # the first block has a key in every row: m_new is finite
        alpha = (nh.ex2_approx_ftz((m[0] - m_new[0]) * SCALE), nh.ex2_approx_ftz((m[1] - m_new[1]) * SCALE))
        p = exp2_rows(s, SCALE, (m_new[0] * SCALE, m_new[1] * SCALE))
        l = row_sum(p, (alpha[0] * l[0], alpha[1] * l[1]))
        o = scale_rows(o, alpha)
        packed = nh.pack_tuple(p, "bf16")  # all of P's A registers before the first RS wgmma
        V_RING.wait(smem + V_BARS, v_st)
        v_desc = V_DESC.advance(v0, v_st.stage, V.tile_bytes)
        nh.wgmma_fence()
        for kk in range(V.k_steps):
            o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), V_DESC.k_step(v_desc, kk), 1, "bf16", "bf16", 1, 1,
                                      V_TNSP)
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        o = nh.wgmma_fence_operand(o)
        if t % 32 == 0:
            V_RING.release(smem + V_BARS, v_st)
        m = m_new
        k_st, v_st = K_RING.advance(k_st), V_RING.advance(v_st)
    o = scale_rows(o, (nh.rcp_approx_ftz(l[0]), nh.rcp_approx_ftz(l[1])))
    STORE.tile(o, smem + OUT, t, EPI, nh.tensormap_param_address(map_o), cuda.blockIdx.x * BLOCK, 0, np.int32(0))
    STORE.drain(t)


BODY = WS.body(init, producer, consumer)


@cuda.jit(launch_bounds=WS.launch_bounds)
def attention_tile(map_q, map_k, map_v, map_o, S):
    BODY((map_q, map_k, map_v, map_o, S))


def main():
    rng = np.random.default_rng()
    L, S = 200, 333  # partial query tiles and key blocks
    bits = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    value = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    q, k, v = bits(rng.standard_normal((L, D))), bits(rng.standard_normal((S, D))), bits(rng.standard_normal((S, D)))
    o = cuda.to_device(np.full((L, D), 0x7FC0, np.uint16))  # NaN-poisoned
    d_q, d_k, d_v = cuda.to_device(q), cuda.to_device(k), cuda.to_device(v)  # (alive while the kernel runs)
    maps = (operand_tensor_map(d_q, Q), operand_tensor_map(d_k, KT), operand_tensor_map(d_v, V),
            tensor_map_arg(o, STORE.box, swizzle=STORE.swizzle, dtype="bf16"))
    launch(attention_tile, -(-L // BLOCK), WS.threads, (*maps, S), shared_mem=PLAN.size)
    logits = value(q) @ value(k).T / math.sqrt(D)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    ref = (weights / weights.sum(axis=1, keepdims=True)) @ value(v)
    err = np.linalg.norm(value(o.copy_to_host()) - ref) / np.linalg.norm(ref)
    print(f"attention L={L} S={S} d={D}, 64-key blocks: relative error {err:.1e}: {'OK' if err < 2e-2 else 'FAILED'}")
    assert err < 2e-2


KERNELS = [(attention_tile, (TENSORMAP_ARG,) * 4 + (types.int64,))]

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
