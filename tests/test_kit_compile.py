"""The kit's device parts compile for sm_90a to the instructions they promise, with no spills
and no ptxas warnings (CPU: PTX from NVVM, the cubin from numba's LTO link, SASS from nvdisasm).

The kernels are small harnesses; the examples (test_examples_compile.py) compile the parts
together, including the persistent GEMM.
"""

import numpy as np
import pytest
from numba import cuda
from numba.cuda import types

from numba_hopper import intrinsics as nh
from numba_hopper.kit import (NamedBarriers, make_a_loader, make_a_operand_fp8, make_descriptors, make_mma,
                              make_ordered_barrier, make_ring, make_tile_loads, make_tile_scheduler, make_tile_store,
                              operand_layout, thread_rows, warp_specialization)
from numba_hopper.kit.epilogue import TileEpilogue
from numba_hopper.kit.fragments import (a_operand, exp2_rows, mask_cols, row_max, row_sum, scale_rows,
                                        thread_row_sum)
from numba_hopper.kit.host import TENSORMAP_ARG
from numba_hopper.tools.sass import inspect_kernel

NEG_INF = np.float32(-np.inf)
A64 = operand_layout("K", 128, "bf16", mn=64, k=64)
B64 = operand_layout("K", 128, "bf16", mn=64, k=64)
V64 = operand_layout("MN", 128, "bf16", mn=64, k=64)
QK, V_DESC = make_mma(A64, B64), make_descriptors(V64)
V_TNSP = V64.tnsp


def _clean(report):
    assert report.spill_bytes == 0 and report.stack_frame == 0, report.summary()
    assert not report.warnings, report.summary()


@cuda.jit(launch_bounds=(128, 1))
def _softmax_pv(out, limit):
    """S = Q K^T, the online-softmax pieces, P packed, P V by four RS wgmmas."""
    t = np.int32(cuda.threadIdx.x)
    smem = nh.dynamic_shared_base()
    d = QK_DESC.at(smem)
    s = QK.k_block(QK.accumulator(), d, d, True)
    nh.wgmma_wait_group(0)
    s = mask_cols(nh.wgmma_fence_operand(s), t, limit, NEG_INF)
    m = row_max(s, (NEG_INF, NEG_INF))
    p = exp2_rows(s, np.float32(0.18), (m[0], m[1]))
    l = row_sum(p, (np.float32(0), np.float32(0)))
    packed = nh.pack_tuple(p, "bf16")
    o = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    v = V_DESC.at(smem + 8192)
    nh.wgmma_fence()
    for kk in range(V64.k_steps):
        o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), V_DESC.k_step(v, kk), 1, "bf16", "bf16", 1, 1, V_TNSP)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    o = scale_rows(nh.wgmma_fence_operand(o), (nh.rcp_approx_ftz(l[0]), nh.rcp_approx_ftz(l[1])))
    part = thread_row_sum(o, (np.float32(0), np.float32(0)))
    out[t] = part[0] + part[1]


QK_DESC = make_descriptors(A64)


def test_softmax_and_rs_operand_compile_to_one_fence_per_batch():
    r = inspect_kernel(_softmax_pv, "void(float32[::1], int32)")
    _clean(r)
    assert r.count("HGMMA") == 8 and r.count("WARPGROUP.ARRIVE") == 2, r.summary()  # no fence per RS wgmma
    assert r.count("MUFU.EX2") == 32 and r.count("MUFU.RCP") == 2, r.opcodes
    assert r.count("F2FP.BF16.F32.PACK_AB") == 16, r.opcodes  # one cvt per register pair
    assert r.count("SHFL.BFLY") == 8, r.opcodes  # row max and row sum: 2 rows x 2 shuffles each
    assert r.count("FMNMX") >= 32, r.opcodes
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" in r.ptx and ", 1, 1, 1; }" in r.ptx


A8 = operand_layout("K", 128, "e4m3", mn=64, k=128)
A8_DESC = make_descriptors(A8)
TO_E4M3 = make_a_operand_fp8("e4m3")


@cuda.jit(launch_bounds=(128, 1))
def _fp8_rs(out, n):
    t = np.int32(cuda.threadIdx.x)
    smem = nh.dynamic_shared_base()
    d = A8_DESC.at(smem)
    acc = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    acc = nh.wgmma_mma_async(acc, d, d, 0, "e4m3", "e4m3", 1, 1, 0, 0)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    acc = nh.wgmma_fence_operand(acc)
    regs = (TO_E4M3(acc, 0, t % 32), TO_E4M3(acc, 1, t % 32))
    o = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    for kk in range(2):
        o = nh.wgmma_mma_async_rs(o, regs[kk], A8_DESC.k_step(d, kk), 1, "e4m3", "e4m3", 1, 1, 0)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    out[t] = nh.wgmma_fence_operand(o)[5]


def test_fp8_a_operand_exchanges_pairs_in_the_quad():
    r = inspect_kernel(_fp8_rs, "void(float32[::1], int32)")
    _clean(r)
    assert r.count("QGMMA") == 3, r.summary()
    assert r.count("SHFL.IDX") == 16 and r.count("PRMT") == 8, r.opcodes  # two shuffles and a PRMT a register
    assert r.count("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C") == 16, r.opcodes


A128 = operand_layout("K", 128, "bf16", mn=128, k=64)
B256 = operand_layout("MN", 128, "bf16", mn=256, k=64)
WS = warp_specialization(consumers=2, producer_regs=40, cluster_size=2)
RING = make_ring(4, consumer_arrivals=16, tx_bytes=A128.tile_bytes + B256.tile_bytes, cluster_size=2)
MMA, A_DESC, B_DESC = make_mma(A128, B256), make_descriptors(A128), make_descriptors(B256)
A_LOADS, B_LOADS = make_tile_loads(A128), make_tile_loads(B256)
A_ROWS = A128.mn_offset(64)
BARS = 4 * (A128.tile_bytes + B256.tile_bytes)


@cuda.jit(device=True, forceinline=True)
def _init(args):
    RING.init(nh.dynamic_shared_base() + BARS)


@cuda.jit(device=True, forceinline=True)
def _producer(args):
    map_a, map_b, out, K = args
    if cuda.threadIdx.x < 32 and nh.elect_sync():
        smem = nh.dynamic_shared_base()
        st = RING.start()
        for kb in range(np.int32(K // 64)):
            full = RING.acquire(smem + BARS, st)
            A_LOADS.load(smem + st.stage * A128.tile_bytes, nh.tensormap_param_address(map_a), 0, kb * 64, full)
            B_LOADS.load(smem + 65536 + st.stage * B256.tile_bytes, nh.tensormap_param_address(map_b), 0, kb * 64, full)
            st = RING.advance(st)


@cuda.jit(device=True, forceinline=True)
def _consumer(cw, t, args):
    _, _, out, K = args
    smem = nh.dynamic_shared_base()
    a0, b0 = A_DESC.at(smem + A_ROWS * cw), B_DESC.at(smem + 65536)
    acc = MMA.accumulator()
    st = RING.start()
    for kb in range(np.int32(K // 64)):
        RING.wait(smem + BARS, st)
        acc = MMA.k_block(acc, A_DESC.advance(a0, st.stage, A128.tile_bytes), B_DESC.advance(b0, st.stage,
                                                                                          B256.tile_bytes), kb == 0)
        nh.wgmma_wait_group(0)
        if t % 32 == 0:
            RING.release_to(smem + BARS, st, 0b11)
        st = RING.advance(st)
    acc = nh.wgmma_fence_operand(acc)
    out[t + 128 * cw] = acc[3]


_BODY = WS.body(_init, _producer, _consumer)


@cuda.jit(launch_bounds=WS.launch_bounds)
def _skeleton(map_a, map_b, out, K):
    _BODY((map_a, map_b, out, K))


def test_warp_specialized_skeleton_in_a_cluster():
    r = inspect_kernel(_skeleton, (TENSORMAP_ARG, TENSORMAP_ARG, types.float32[::1], types.int64))
    _clean(r)
    assert r.count("USETMAXREG") == 2, r.summary()  # the producer's dec, the consumers' inc
    assert r.count("UCGABAR_ARV") >= 2 and r.count("UCGABAR_WAIT") >= 2, r.summary()  # after init, before exit
    assert r.count("UTMALDG") >= 5 and r.count("HGMMA") == 4, r.summary()
    assert not r.warpsync_before_wgmma, "the warp-uniform warpgroup index keeps the consumers converged"
    assert "mapa.shared::cluster" in r.ptx and "mbarrier.arrive.shared::cluster" in r.ptx  # release_to a peer
    assert r.registers == WS.at_launch


ORDER = make_ordered_barrier(NamedBarriers().allocate("turns", 2), members=2)


@cuda.jit(launch_bounds=(256, 1))
def _ordered(out, n):
    member = np.int32(cuda.threadIdx.x // 128)
    ORDER.start(member)
    for i in range(n):
        ORDER.wait(member)
        out[cuda.threadIdx.x] += i
        ORDER.arrive(member)


def test_ordered_barrier_is_named_barriers():
    r = inspect_kernel(_ordered, "void(int32[::1], int32)")
    _clean(r)
    assert r.count("BAR.SYNC") >= 1 and r.count("BAR.ARV") >= 2, r.opcodes
    assert "bar.sync" in r.ptx and "bar.arrive" in r.ptx


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("n, dtype, stsm, sts64, stores", [(256, "bf16", 16, 0, 4), (96, "f16", 6, 0, 3),
                                                            (64, "f32", 0, 16, 2)])
def test_tile_store(n, dtype, stsm, sts64, stores):
    store = make_tile_store(n, dtype, buffers=2)

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_out, out, x):
        t = np.int32(cuda.threadIdx.x)
        acc = nh.wgmma_accumulator(n, "f32")
        frag = nh.tuple_as_array(acc)
        for r in range(n // 2):
            frag[r] = x[r]
        acc = nh.array_as_tuple(frag, acc)
        store.tile(acc, nh.dynamic_shared_base(), t, 1, nh.tensormap_param_address(map_out), 64, 0, np.int32(0))
        store.drain(t)
        store.direct(acc, out, 3, 5, t)

    out_t = types.float32[:, ::1] if dtype == "f32" else types.uint16[:, ::1]
    r = inspect_kernel(kernel, (TENSORMAP_ARG, out_t, types.float32[::1]))
    _clean(r)
    assert r.count("STSM") == stsm and r.count("STS.64") == sts64, r.opcodes
    assert r.count("UTMASTG") == stores and r.count("BAR.SYNC") == 2 * stores, r.opcodes


@pytest.mark.parametrize("n, dtype, stsm, sts64, stores, packs", [(256, "bf16", 16, 0, 4, 64), (64, "f32", 0, 16, 2, 0)])
def test_tile_store_writes_a_held_tile(n, dtype, stsm, sts64, stores, packs):
    """``convert`` holds a 16-bit tile as packed pairs (one cvt per pair, F2FP), an f32 one as it
    is; ``write_converted`` stores what it holds a sub-tile at a time, as ``tile`` does."""
    store = make_tile_store(n, dtype, buffers=2)
    stride = store.buffer_bytes // store.buffers

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_out, x):
        t = np.int32(cuda.threadIdx.x)
        acc = nh.wgmma_accumulator(n, "f32")
        frag = nh.tuple_as_array(acc)
        for r in range(n // 2):
            frag[r] = x[r]
        held = store.convert(nh.array_as_tuple(frag, acc))
        buf0 = nh.dynamic_shared_base()
        for q in range(n // store.cols):
            buf = buf0 + (q % 2) * stride
            store.acquire(t == 0, 1)
            store.write_converted(nh.tuple_as_array(held), buf, q, t)
            store.commit(buf, t == 0, 1, nh.tensormap_param_address(map_out), q * store.cols, 64)
        store.drain(t)

    r = inspect_kernel(kernel, (TENSORMAP_ARG, types.float32[::1]))
    _clean(r)
    assert r.count("F2FP") == packs and r.count("STSM") == stsm and r.count("STS.64") == sts64, r.opcodes
    assert r.count("UTMASTG") == stores and r.count("BAR.SYNC") == 2 * stores, r.opcodes


SCHED = make_tile_scheduler(128, 256, raster="grouped", group_m=8)
LINEAR = make_tile_scheduler(128, 128, raster="linear")


@cuda.jit
def _walk(out, M, N, batches):
    for sched_id in range(2):
        w = SCHED.work(M, N, batches) if sched_id == 0 else LINEAR.work(M, N, batches)
        tile = SCHED.first()
        while tile < w.num_tiles:
            o = SCHED.origin(w, tile) if sched_id == 0 else LINEAR.origin(w, tile)
            out[tile] = o.batch + o.m0 + o.n0
            tile = SCHED.next(tile)


def test_schedulers_divide_in_32_bits():
    r = inspect_kernel(_walk, "void(uint32[::1], int64, int64, int64)")
    _clean(r)
    assert r.count("CALL") == 0, r.opcodes  # no 64-bit division subroutine
    assert "div.u32" in r.ptx and "div.s64" not in r.ptx and "div.u64" not in r.ptx


A_SW64 = operand_layout("K", 64, "bf16", mn=64, k=64)
LOAD_A = make_a_loader(A_SW64)


@cuda.jit(launch_bounds=(128, 1))
def _ldmatrix_a(out, n):
    t = np.int32(cuda.threadIdx.x)
    smem = nh.dynamic_shared_base()
    regs = (LOAD_A(smem, t, 0), LOAD_A(smem, t, 1), LOAD_A(smem, t, 2), LOAD_A(smem, t, 3))
    d = QK_DESC.at(smem + 8192)
    acc = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    for kk in range(4):
        acc = nh.wgmma_mma_async_rs(acc, regs[kk], QK_DESC.k_step(d, kk), 1, "bf16", "bf16", 1, 1, 0)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    out[t] = nh.wgmma_fence_operand(acc)[0]


def test_a_loader_is_one_ldmatrix_per_slice():
    r = inspect_kernel(_ldmatrix_a, "void(float32[::1], int32)")
    _clean(r)
    assert r.count("LDSM") == 4 and r.count("HGMMA") == 4 and r.count("WARPGROUP.ARRIVE") == 1, r.summary()


A_SHARED = operand_layout("K", 128, "bf16", mn=128, k=64)
B_SHARED = operand_layout("MN", 128, "bf16", mn=256, k=64)
A_PARTS, B_PARTS = make_tile_loads(A_SHARED, parts=2), make_tile_loads(B_SHARED, parts=2)


@cuda.jit
def _multicast_parts(map_a, map_b, rank):
    smem = nh.dynamic_shared_base()
    A_PARTS.load_part(smem, nh.tensormap_param_address(map_a), 0, 0, smem + 65536, rank, 0b11)
    B_PARTS.load_part_3d(smem + 16384, nh.tensormap_param_address(map_b), 0, 0, 1, smem + 65536, rank, 0b11)


def test_multicast_loads_of_tile_parts():
    r = inspect_kernel(_multicast_parts, (TENSORMAP_ARG, TENSORMAP_ARG, types.int32))
    _clean(r)
    assert r.ptx.count(".multicast::cluster") == 3  # A: one box (its half of the rows), B: two of four boxes
    assert r.count("UTMALDG") == 3, r.opcodes


def test_loads_of_an_unshared_tile_and_its_l2_prefetch():
    """``load_part_3d`` of a tile no peer shares (parts = 1) is the plain load; ``prefetch_3d``
    is one L2 prefetch per box, no shared memory."""
    loads = make_tile_loads(B_SHARED)  # four 64 x 64 boxes

    @cuda.jit
    def kernel(map_b, rank):
        smem = nh.dynamic_shared_base()
        tmap = nh.tensormap_param_address(map_b)
        loads.load_part_3d(smem, tmap, 0, 0, 1, smem + 65536, rank, 0b11)
        loads.prefetch_3d(tmap, 64, 0, 1)

    r = inspect_kernel(kernel, (TENSORMAP_ARG, types.int32))
    _clean(r)
    assert ".multicast::cluster" not in r.ptx and r.count("UTMALDG") == 4 and r.count("UTMAPF") == 4, r.opcodes


def _scaled_pairs(out_dtype):
    """Hooks: each pair times 2 plus its tile column, the bits of |v| tracked for an amax."""
    per_block = out_dtype in ("bf16", "f16")

    @cuda.jit(device=True, forceinline=True)
    def gather(buf, addr, row, col, q, col0):
        c = np.float32(col0 + q * 16 + col)  # (the test's sub-tiles: 16 columns)
        if per_block:
            return c, c, c + 8, c + 8
        return c

    @cuda.jit(device=True, forceinline=True)
    def pair(frag, k, row, j, col, c, col0):
        v0, v1 = frag[k] * np.float32(2) + c, frag[k + 1] * np.float32(2) + (c + np.float32(1))
        return v0, v1, max(nh.abs_bits(v0), nh.abs_bits(v1))

    return TileEpilogue(gather, pair)


@pytest.mark.parametrize("dtype, stsm, sts", [("bf16", 4, 0), ("f32", 0, 16), ("e4m3", 0, 16)])
def test_tile_store_hooks_map_every_pair(dtype, stsm, sts):
    """The sub-tile parts with hooks: acquire, write (16 columns a sub-tile), commit_3d."""
    store = make_tile_store(64, dtype, buffers=2, cols=16 if dtype != "e4m3" else 32,
                            epilogue=_scaled_pairs(dtype))
    chunks = 64 // store.cols

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_out, amax, x):
        t = np.int32(cuda.threadIdx.x)
        acc = nh.wgmma_accumulator(64, "f32")
        frag = nh.tuple_as_array(acc)
        for r in range(32):
            frag[r] = x[r]
        row, m = thread_rows(t)[0], np.uint32(0)
        smem = nh.dynamic_shared_base()
        for q in range(chunks):
            buf = smem + (q % 2) * (store.buffer_bytes // 2)
            store.acquire(t == 0, 1)
            m = max(m, store.write(frag, buf, q, row, t % 32, 64))
            store.commit_3d(buf, t == 0, 1, nh.tensormap_param_address(map_out), 64 + q * store.cols, 0, 0)
        store.drain(t)
        amax[t] = m

    r = inspect_kernel(kernel, (TENSORMAP_ARG, types.uint32[::1], types.float32[::1]))
    _clean(r)
    stores = r.count("STS.64") if dtype == "f32" else r.count("STS.U16")
    assert r.count("STSM") == stsm and (stsm or stores == sts), r.opcodes
    assert r.count("UTMASTG") == chunks and r.count("BAR.SYNC") == 2 * chunks, r.opcodes
