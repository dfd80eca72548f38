"""TMA on the GPU: loads (every swizzle, edges, ranks 2/3/5), stores, reductions, multicast.

Every output starts poisoned (0xFFFF.. = NaN for bf16/f32) so a word TMA never wrote shows up.
Tensors are bf16 held in uint16 arrays (numba has no bfloat16), described with dtype="bf16".
Kernels copy shared memory out as raw 32-bit words; the host reinterprets them. (No
@cuda.jit(device=True) helpers: numba-cuda compiles those for the current device, so they
could not be compiled for inspection on a machine without a GPU.)

Uses the mbarrier/shared-address intrinsics of ``numba_hopper.intrinsics`` (shared_address,
mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_wait_parity, fence_mbarrier_init,
fence_proxy_async); they are looked up when a kernel compiles, so this module collects on CPU.
"""

import numpy as np
import pytest
from numba import cuda

from numba_hopper import intrinsics as I
from numba_hopper.runtime import tensormap as tm
from numba_hopper.runtime.launch import launch
from numba_hopper.runtime.tensormap import TensorMap

pytestmark = pytest.mark.gpu

TILE_WORDS = 2048  # 8 KB of shared memory per tile buffer, 1024-byte aligned
TILE_HALFS = 2 * TILE_WORDS
POISON16 = np.uint16(0xFFFF)
POISON32 = np.uint32(0xFFFFFFFF)


# --- host-side references ----------------------------------------------------------------


def expected_box(a, start, box, fill=0):
    """The box of ``a`` at ``start`` (numpy order), out-of-bounds elements = ``fill``."""
    out = np.full(box, fill, a.dtype)
    lo = [max(s, 0) for s in start]
    hi = [min(s + b, n) for s, b, n in zip(start, box, a.shape)]
    if all(h > l for l, h in zip(lo, hi)):
        src = tuple(slice(l, h) for l, h in zip(lo, hi))
        dst = tuple(slice(l - s, h - s) for l, h, s in zip(lo, hi, start))
        out[dst] = a[src]
    return out


def unswizzle(raw: np.ndarray, swizzle: int) -> np.ndarray:
    """Undo TMA's shared-memory swizzle on a 1024-byte-aligned buffer of bytes.

    The 16-byte chunk at logical byte offset o lands at o ^ (((o >> 7) & (swizzle/16 - 1)) << 4):
    bits 4.. of the address are XORed with bits 7.. (CUTLASS Swizzle<1|2|3, 4, 3>). For a box
    whose inner dimension spans exactly ``swizzle`` bytes that is "chunk index XOR row index"
    for 128B, "XOR (row // 2)" for 64B and "XOR (row // 4)" for 32B.
    """
    if swizzle == 0:
        return raw
    chunks = raw.reshape(-1, 16)
    logical = np.arange(len(chunks))
    physical = logical ^ ((logical >> 3) & (swizzle // 16 - 1))
    return chunks[physical].reshape(-1)


def as_bytes(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words).view(np.uint8)


# --- kernels ----------------------------------------------------------------------------


def make_load_kernel(issue):
    """CTA b loads one box and copies it out raw: ``issue(tile, tmap, coords, b, bar)`` (a
    device function) issues the TMA load of the box at ``coords[b]`` (innermost first)."""

    @cuda.jit
    def load(tmap, coords, nbytes, out):
        tile = cuda.shared.array(TILE_WORDS, np.uint32, alignment=1024)
        bars = cuda.shared.array(1, np.uint64)
        b = cuda.blockIdx.x
        bar = I.shared_address(bars)
        if cuda.threadIdx.x == 0:
            I.mbarrier_init(bar, 1)
            I.fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            I.mbarrier_arrive_expect_tx(bar, nbytes)
            issue(I.shared_address(tile), tmap, coords, b, bar)
        I.mbarrier_wait_parity(bar, 0)
        for i in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            out[b, i] = tile[i]

    return load


def make_load2d_kernel(map_address):
    """The 2-D load kernel for a tensor map at ``map_address(tmap)``."""

    @cuda.jit(device=True, forceinline=True)
    def issue(tile, tmap, coords, b, bar):
        address = map_address(tmap)
        I.prefetch_tensormap(address)
        I.tma_load_2d(tile, address, coords[b, 0], coords[b, 1], bar)

    return make_load_kernel(issue)


@cuda.jit(device=True, forceinline=True)
def acquired(tmap):
    """A map in global memory, written by the host: acquired for the tensor proxy first."""
    I.fence_proxy_tensormap_acquire(tmap)
    return tmap


@cuda.jit(device=True, forceinline=True)
def issue_3d(tile, tmap, coords, b, bar):
    I.tma_load_3d(tile, acquired(tmap), coords[b, 0], coords[b, 1], coords[b, 2], bar)


@cuda.jit(device=True, forceinline=True)
def issue_5d(tile, tmap, coords, b, bar):
    I.tma_load_5d(tile, acquired(tmap), coords[b, 0], coords[b, 1], coords[b, 2], coords[b, 3], coords[b, 4], bar)


load2d_kernel = make_load2d_kernel(acquired)
load3d_kernel = make_load_kernel(issue_3d)
load5d_kernel = make_load_kernel(issue_5d)


def run_loads(kernel, tmap, starts):
    """Launch one CTA per box start (numpy order); return the raw bytes of each box."""
    coords = np.array([list(reversed(s)) for s in starts], np.int32)  # innermost first
    nwords = tmap.box_bytes // 4
    out = cuda.to_device(np.full((len(starts), nwords), POISON32))
    launch(kernel, len(starts), 128, (tmap.device_ptr, cuda.to_device(coords), tmap.box_bytes, out))
    cuda.synchronize()
    return [as_bytes(row) for row in out.copy_to_host()]


RNG = np.random.default_rng(20261104)
A2 = RNG.integers(0, 2**16, (100, 200), dtype=np.uint16)  # bf16 bits; row = 400 bytes
# The innermost coordinate must be a multiple of 16 bytes (8 bf16 columns): H100 raises
# CUDA_ERROR_ILLEGAL_INSTRUCTION otherwise. Rows may start anywhere.
STARTS_2D = [(0, 0), (37, 48), (90, 176), (-3, -8), (99, 192)]  # the last three cross edges


@pytest.fixture(scope="module")
def a2():
    return cuda.to_device(A2)


# --- loads --------------------------------------------------------------------------------


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_load_2d_bf16_every_swizzle_with_edges(a2, swizzle):
    inner = 24 if swizzle == 0 else swizzle // 2  # 48 bytes unswizzled, else the whole span
    t = TensorMap(a2, (16, inner), swizzle=swizzle, dtype="bf16")
    assert t.box_bytes == 16 * inner * 2
    for start, raw in zip(STARTS_2D, run_loads(load2d_kernel, t, STARTS_2D)):
        got = unswizzle(raw, swizzle).view(np.uint16).reshape(16, inner)
        np.testing.assert_array_equal(got, expected_box(A2, start, (16, inner)), err_msg=f"start {start}")


def test_swizzle_really_permutes(a2):
    """The 128B-swizzled bytes differ from the plain ones (the unswizzle above is not a no-op)."""
    t = TensorMap(a2, (16, 64), swizzle=128, dtype="bf16")
    (raw,) = run_loads(load2d_kernel, t, [(0, 0)])
    assert not np.array_equal(raw.view(np.uint16).reshape(16, 64), A2[:16, :64])


def test_load_oob_fill_nan(a2):
    t = TensorMap(a2, (16, 32), oob_fill="nan", dtype="bf16")
    start = (90, 176)
    (raw,) = run_loads(load2d_kernel, t, [start])
    got = raw.view(np.uint16).reshape(16, 32)
    inside = np.zeros((16, 32), bool)
    inside[:10, :24] = True
    np.testing.assert_array_equal(got[inside], expected_box(A2, start, (16, 32))[inside])
    oob = got[~inside]
    assert np.all((oob & 0x7F80) == 0x7F80) and np.all((oob & 0x7F) != 0), f"not bf16 NaN: {oob[:4]}"


def test_load_rank3_swizzle64():
    a = RNG.integers(0, 2**16, (5, 40, 48), dtype=np.uint16)
    t = TensorMap(cuda.to_device(a), (2, 8, 32), swizzle=64, dtype="bf16")
    starts = [(0, 0, 0), (4, 35, 24), (1, -4, 16)]
    for start, raw in zip(starts, run_loads(load3d_kernel, t, starts)):
        got = unswizzle(raw, 64).view(np.uint16).reshape(2, 8, 32)
        np.testing.assert_array_equal(got, expected_box(a, start, (2, 8, 32)), err_msg=f"start {start}")


def test_load_rank5_f32():
    a = RNG.standard_normal((3, 4, 5, 6, 16)).astype(np.float32)
    box = (2, 2, 3, 4, 8)
    t = TensorMap(cuda.to_device(a), box)
    assert t.dtype == "f32" and t.box_bytes == 2 * 2 * 3 * 4 * 8 * 4
    starts = [(0, 0, 0, 0, 0), (1, 3, 3, 4, 12), (2, 1, -1, 2, 8)]
    for start, raw in zip(starts, run_loads(load5d_kernel, t, starts)):
        got = raw.view(np.float32).reshape(box)
        np.testing.assert_array_equal(got, expected_box(a, start, box), err_msg=f"start {start}")


# The tensor map passed by value (a TensorMapArg): the launch wrote it, so no fence.
load2d_by_value_kernel = make_load2d_kernel(I.tensormap_param_address)


def test_load_2d_with_the_map_passed_by_value_at_two_addresses(a2):
    """A template encoded for one array reads another of the same layout once its ``value``
    (the address) is set, and a prepared launch rebinds that value as it rebinds a pointer."""
    from numba_hopper.runtime.launch import prepare_launch

    other = RNG.integers(0, 2**16, A2.shape, dtype=np.uint16)
    arg = tm.TensorMapArg(tm.encode_template(a2, (16, 64), swizzle=128, dtype="bf16"), a2.device_ctypes_pointer.value)
    coords = cuda.to_device(np.array([list(reversed(s)) for s in STARTS_2D], np.int32))
    out = cuda.to_device(np.full((len(STARTS_2D), 16 * 64 // 2), POISON32))
    run = prepare_launch(load2d_by_value_kernel, len(STARTS_2D), 128, (arg, coords, 16 * 64 * 2, out))
    index = run.leaves[0]  # the map's parameter
    for array, host in ((a2, A2), (cuda.to_device(other), other)):
        out.copy_to_device(np.full(out.shape, POISON32))
        run(0, [array.device_ctypes_pointer.value], [(index, 0, 0)])
        cuda.synchronize()
        for start, row in zip(STARTS_2D, out.copy_to_host()):
            got = unswizzle(as_bytes(row), 128).view(np.uint16).reshape(16, 64)
            np.testing.assert_array_equal(got, expected_box(host, start, (16, 64)), err_msg=f"start {start}")


def test_descriptor_cache_returns_the_same_object(a2):
    t1 = TensorMap(a2, (16, 64), swizzle=128, dtype="bf16")
    t2 = TensorMap(a2, (16, 64), swizzle=128, dtype="bf16")
    assert t1 is t2 and t1.device_ptr == t2.device_ptr
    assert t1.device_ptr % 64 == 0
    assert TensorMap(a2, (16, 32), swizzle=64, dtype="bf16") is not t1
    assert tm.cache_info()["size"] >= 2


def test_descriptor_matches_the_uploaded_copy(a2):
    t = TensorMap(a2, (8, 64), swizzle=128, dtype="bf16")
    base = t.device_ptr - t._owner.device_ctypes_pointer.value
    uploaded = t._owner.copy_to_host()[base : base + 128].tobytes()
    assert uploaded == t.descriptor


# --- stores and reductions --------------------------------------------------------------


@cuda.jit
def store2d_kernel(tmap, coords, tiles):
    """CTA b writes tiles[b] into shared memory with ordinary stores, then TMA-stores it."""
    tile = cuda.shared.array(TILE_HALFS, np.uint16, alignment=1024)
    b = cuda.blockIdx.x
    for i in range(cuda.threadIdx.x, tiles.shape[1], cuda.blockDim.x):
        tile[i] = tiles[b, i]
    I.fence_proxy_async()  # generic-proxy writes -> visible to the TMA engine
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        I.fence_proxy_tensormap_acquire(tmap)
        I.tma_store_2d(tmap, I.shared_address(tile), coords[b, 0], coords[b, 1])
        I.bulk_commit_group()
        I.bulk_wait_group(0)


@cuda.jit
def reduce_add_2d_kernel(tmap, coords, tiles):
    tile = cuda.shared.array(TILE_WORDS, np.float32, alignment=1024)
    b = cuda.blockIdx.x
    for i in range(cuda.threadIdx.x, tiles.shape[1], cuda.blockDim.x):
        tile[i] = tiles[b, i]
    I.fence_proxy_async()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        I.fence_proxy_tensormap_acquire(tmap)
        I.tma_reduce_2d("add", tmap, I.shared_address(tile), coords[b, 0], coords[b, 1])
        I.bulk_commit_group()
        I.bulk_wait_group_read(0)
        I.bulk_wait_group(0)


def test_store_round_trip_with_clipped_edge_tiles():
    """Boxes of 16 x 64 tile a 100 x 200 view of a larger poisoned buffer; the edge boxes are
    clipped to the view, so nothing outside it is written."""
    box = (16, 64)
    big = np.full((110, 216), POISON16)  # row = 432 bytes
    big_d = cuda.to_device(big)
    view = big_d[:100, :200]
    t = TensorMap(view, box, dtype="bf16")
    starts = [(r, c) for r in range(0, 100, 16) for c in range(0, 200, 64)]
    tiles = np.stack([expected_box(A2, s, box, fill=0x1234).reshape(-1) for s in starts])
    coords = np.array([(c, r) for r, c in starts], np.int32)
    launch(store2d_kernel, len(starts), 128, (t.device_ptr, cuda.to_device(coords), cuda.to_device(tiles)))
    cuda.synchronize()
    got = big_d.copy_to_host()
    np.testing.assert_array_equal(got[:100, :200], A2)
    assert np.all(got[100:, :] == POISON16) and np.all(got[:, 200:] == POISON16)


def test_reduce_add_out_equals_pre_plus_tile():
    box = (16, 32)
    pre = RNG.standard_normal((64, 96)).astype(np.float32)
    out = cuda.to_device(pre)
    t = TensorMap(out, box)
    starts = [(0, 0), (20, 40), (56, 80)]  # the last is clipped in both dimensions
    tiles = RNG.standard_normal((len(starts), 16 * 32)).astype(np.float32)
    coords = np.array([(c, r) for r, c in starts], np.int32)
    launch(reduce_add_2d_kernel, len(starts), 128, (t.device_ptr, cuda.to_device(coords), cuda.to_device(tiles)))
    cuda.synchronize()
    want = pre.copy()
    for (r, c), tile in zip(starts, tiles):
        tile = tile.reshape(box)
        rr, cc = min(r + 16, 64) - r, min(c + 32, 96) - c
        want[r : r + rr, c : c + cc] += tile[:rr, :cc]
    np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-6, atol=1e-6)


# --- multicast ------------------------------------------------------------------------------


@cuda.jit
def multicast2d_kernel(tmap, c0, c1, nbytes, out):
    """Cluster of 2: rank 0 loads one box into both CTAs; each CTA's barrier expects the bytes."""
    tile = cuda.shared.array(TILE_WORDS, np.uint32, alignment=1024)
    bars = cuda.shared.array(1, np.uint64)
    bar = I.shared_address(bars)
    if cuda.threadIdx.x == 0:
        I.mbarrier_init(bar, 1)
        I.fence_mbarrier_init()
    cuda.syncthreads()
    I.cluster_sync()  # both barriers initialised before anyone multicasts into them
    if cuda.threadIdx.x == 0:
        I.mbarrier_arrive_expect_tx(bar, nbytes)
        if I.cluster_ctarank() == 0:
            I.fence_proxy_tensormap_acquire(tmap)
            I.tma_load_multicast_2d(I.shared_address(tile), tmap, c0, c1, bar, 0b11)
    I.mbarrier_wait_parity(bar, 0)
    for i in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[cuda.blockIdx.x, i] = tile[i]
    I.cluster_sync()


def test_multicast_fills_both_ctas_of_a_cluster(a2):
    t = TensorMap(a2, (16, 64), swizzle=128, dtype="bf16")
    start = (90, 160)  # crosses the bottom edge
    out = cuda.to_device(np.full((2, t.box_bytes // 4), POISON32))
    launch(multicast2d_kernel, 2, 128, (t.device_ptr, start[1], start[0], t.box_bytes, out), cluster=2)
    cuda.synchronize()
    want = expected_box(A2, start, (16, 64))
    for rank, row in enumerate(out.copy_to_host()):
        got = unswizzle(as_bytes(row), 128).view(np.uint16).reshape(16, 64)
        np.testing.assert_array_equal(got, want, err_msg=f"CTA rank {rank}")


# --- cache-hinted loads and plain bulk copies ------------------------------------------------


@cuda.jit
def hint_and_bulk_kernel(tmap, c0, c1, nbytes, src, dst_load, dst_bulk):
    """Load a box with an evict_last L2 policy and write it out with bulk_copy_s2g; also copy
    ``src`` (nbytes) global -> shared -> global with the plain bulk copies."""
    tile = cuda.shared.array(TILE_WORDS, np.uint32, alignment=1024)
    flat = cuda.shared.array(TILE_WORDS, np.uint32, alignment=128)
    bars = cuda.shared.array(2, np.uint64)
    bar0 = I.shared_address(bars)
    bar1 = bar0 + 8
    if cuda.threadIdx.x == 0:
        I.mbarrier_init(bar0, 1)
        I.mbarrier_init(bar1, 1)
        I.fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        I.fence_proxy_tensormap_acquire(tmap)
        policy = I.createpolicy_fractional("evict_last")
        I.mbarrier_arrive_expect_tx(bar0, nbytes)
        I.tma_load_2d_cache_hint(I.shared_address(tile), tmap, c0, c1, bar0, policy)
        I.mbarrier_arrive_expect_tx(bar1, nbytes)
        I.bulk_copy_g2s(I.shared_address(flat), src, nbytes, bar1)
    I.mbarrier_wait_parity(bar0, 0)
    I.mbarrier_wait_parity(bar1, 0)
    if cuda.threadIdx.x == 0:
        I.bulk_copy_s2g(dst_load, I.shared_address(tile), nbytes)
        I.bulk_copy_s2g(dst_bulk, I.shared_address(flat), nbytes)
        I.bulk_commit_group()
        I.bulk_wait_group(0)


def test_cache_hint_load_and_plain_bulk_copies(a2):
    t = TensorMap(a2, (16, 64), dtype="bf16")
    src = RNG.integers(0, 2**32, t.box_bytes // 4, dtype=np.uint32)
    src_d = cuda.to_device(src)
    dst_load = cuda.to_device(np.full(t.box_bytes // 4, POISON32))
    dst_bulk = cuda.to_device(np.full(t.box_bytes // 4, POISON32))
    ptr = lambda a: a.device_ctypes_pointer.value  # noqa: E731
    launch(hint_and_bulk_kernel, 1, 128,
           (t.device_ptr, 64, 32, t.box_bytes, ptr(src_d), ptr(dst_load), ptr(dst_bulk)))
    cuda.synchronize()
    got = dst_load.copy_to_host().view(np.uint16).reshape(16, 64)
    np.testing.assert_array_equal(got, A2[32:48, 64:128])
    np.testing.assert_array_equal(dst_bulk.copy_to_host(), src)
