"""The kit's device parts on a Hopper GPU, against numpy and float64 (marked gpu: skipped
without one).

Fresh random data each run, outputs poisoned (NaN) first; floats compared by relative
Frobenius error against float64 references built from the exact values of the rounded
inputs, integers and bit patterns exactly. Operand tiles reach shared memory the way kernels
load them: by TMA with the kit's tensor maps and loads, or as the images of ``_ref``.
"""

import functools
import math

import numpy as np
import pytest
from numba import cuda

from _ref import bf16_bits_to_f64, f32_to_bf16_bits, fp8_to_f64, operand_image, random_operand, rel_frobenius
from numba_hopper import intrinsics as nh
from numba_hopper.kit import (NamedBarriers, a_operand, acc_col, acc_row, exp2_rows, make_a_loader, make_a_operand_fp8,
                              make_descriptors, make_mma, make_ordered_barrier, make_ring, make_tile_loads,
                              make_tile_scheduler, make_tile_store, mask_cols, operand_layout, row_max, row_sum,
                              scale_rows, thread_rows, warp_specialization)
from numba_hopper.kit.epilogue import TileEpilogue
from numba_hopper.kit.fragments import accumulator_coords
from numba_hopper.kit.host import operand_tensor_map, persistent_grid, tensor_map_arg
from numba_hopper.kit.scheduler import grouped_tile_host
from numba_hopper.runtime.launch import device_limits, launch

pytestmark = pytest.mark.gpu

NEG_INF = np.float32(-np.inf)
TOL = 1e-5  # f32 accumulation of exactly representable products


def _bf16(rng, shape):
    bits = f32_to_bf16_bits(rng.standard_normal(shape).astype(np.float32))
    return bits, bf16_bits_to_f64(bits)


# --- fragments: the layout, row reductions, exp2, masking, scaling ------------------------------

A64 = operand_layout("K", 128, "bf16", mn=64, k=64)
QK = make_mma(A64, A64)
QK_DESC = make_descriptors(A64)
SCALE = np.float32(0.25)


@cuda.jit(launch_bounds=(128, 1))
def _fragment_kernel(img, b_off, limit, vals, rows, cols, stats, masked, expd, scaled):
    base = nh.dynamic_shared_base()
    t = np.int32(cuda.threadIdx.x)
    for i in range(t, img.size, 128):
        nh.st_shared_u32(base + 4 * i, img[i])
    nh.fence_proxy_async()
    cuda.syncthreads()
    acc = QK.k_block(QK.accumulator(), QK_DESC.at(base), QK_DESC.at(base + b_off), True)
    nh.wgmma_wait_group(0)
    acc = nh.wgmma_fence_operand(acc)
    frag = nh.tuple_as_array(acc)
    for r in range(32):
        vals[t, r] = frag[r]
        rows[t, r] = acc_row(t, r)
        cols[t, r] = acc_col(t, r)
    m = row_max(acc, (NEG_INF, NEG_INF))
    s = row_sum(acc, (np.float32(1), np.float32(2)))
    r0, r1 = thread_rows(t)
    stats[t, 0], stats[t, 1], stats[t, 2], stats[t, 3], stats[t, 4], stats[t, 5] = m[0], m[1], s[0], s[1], r0, r1
    mk = nh.tuple_as_array(mask_cols(acc, t, limit, NEG_INF))
    ex = nh.tuple_as_array(exp2_rows(acc, SCALE, (m[0] * SCALE, m[1] * SCALE)))
    sc = nh.tuple_as_array(scale_rows(acc, (np.float32(0.5), np.float32(3))))
    for r in range(32):
        masked[t, r] = mk[r]
        expd[t, r] = ex[r]
        scaled[t, r] = sc[r]


def test_fragment_layout_reductions_and_row_math():
    rng = np.random.default_rng()
    a_bits, a = _bf16(rng, (64, 64))
    b_bits, b = _bf16(rng, (64, 64))
    img_a, img_b = operand_image(a_bits, "K", 128), operand_image(b_bits, "K", 128)
    image = np.concatenate([img_a.data, img_b.data]).view(np.uint32)
    d = a @ b.T
    limit = 37
    outs = [cuda.to_device(np.full((128, 32), np.nan, np.float32)) for _ in range(6)]
    vals, masked, expd, scaled = outs[0], outs[3], outs[4], outs[5]
    rows, cols = (cuda.to_device(np.full((128, 32), -1, np.int64)) for _ in range(2))
    stats = cuda.to_device(np.full((128, 6), np.nan, np.float32))
    _fragment_kernel[1, 128, 0, image.nbytes](cuda.to_device(image), img_a.data.size, limit, vals, rows, cols, stats,
                                              masked, expd, scaled)
    ref_rows, ref_cols = accumulator_coords(64)
    np.testing.assert_array_equal(rows.copy_to_host(), ref_rows)
    np.testing.assert_array_equal(cols.copy_to_host(), ref_cols)
    v = vals.copy_to_host().astype(np.float64)
    assert rel_frobenius(v, d[ref_rows, ref_cols]) < TOL  # the layout is the hardware's
    tile = np.full((64, 64), np.nan)
    tile[ref_rows, ref_cols] = v  # the device's own values, placed by the layout
    st = stats.copy_to_host().astype(np.float64)
    r0 = 16 * (np.arange(128) // 32) + np.arange(128) % 32 // 4
    np.testing.assert_array_equal(st[:, 4:6], np.stack([r0, r0 + 8], 1))
    row_m = tile.max(axis=1)  # a max is exact: the device's must equal it
    np.testing.assert_array_equal(st[:, 0:2], np.stack([row_m[r0], row_m[r0 + 8]], 1))
    row_s = tile.sum(axis=1)
    np.testing.assert_allclose(st[:, 2:4], np.stack([row_s[r0] + 1, row_s[r0 + 8] + 2], 1), rtol=1e-5, atol=1e-4)
    want_masked = np.where(ref_cols >= limit, -np.inf, v)
    np.testing.assert_array_equal(masked.copy_to_host(), want_masked.astype(np.float32))
    want_exp = 2.0 ** ((v - row_m[ref_rows]) * float(SCALE))
    assert rel_frobenius(expd.copy_to_host().astype(np.float64), want_exp) < 1e-5
    factor = np.where((np.arange(32) >> 1) & 1, 3.0, 0.5)  # register r is in row half (r >> 1) & 1
    np.testing.assert_array_equal(scaled.copy_to_host(), (v * factor).astype(np.float32))


@cuda.jit
def _ex2_fma_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = nh.ex2_fma(x[i])


def test_ex2_fma_against_float64():
    """The FMA-pipe exponential over ``[-130, 0]`` (every integer part, fractions near 0 and
    1, a tiny positive residue): relative error below 9e-5 down to ``2**-126``, +0 from -127
    (so ``-inf`` gives 0, as ``ex2.approx.ftz``)."""
    rng = np.random.default_rng()
    edges = np.array([0.0, -0.0, 1e-7, -1e-7, -1.0, -0.999999, -126.0, -126.5, -127.0, -128.5, -1e30, -np.inf])
    x = np.concatenate([edges, -130 * rng.random(1 << 20), -rng.random(1 << 12)]).astype(np.float32)
    out = cuda.to_device(np.full(x.size, np.nan, np.float32))
    _ex2_fma_kernel[(x.size + 255) // 256, 256](cuda.to_device(x), out)
    got, want = out.copy_to_host().astype(np.float64), 2.0 ** x.astype(np.float64)
    normal = x >= -126
    assert np.max(np.abs(got[normal] / want[normal] - 1)) < 9e-5
    assert np.all(got[x <= -127] == 0)
    assert np.all(np.abs(got[~normal]) < 2.0 ** -126)  # (-127, -126): below the normal range


# --- the accumulator as an RS A operand: bf16, f16 and fp8 ---------------------------------------

V64 = operand_layout("MN", 128, "bf16", mn=64, k=64)  # B of P @ V: V (64 keys x 64) row-major
V_DESC = make_descriptors(V64)
V_TNSP = V64.tnsp
B8 = operand_layout("K", 128, "e4m3", mn=64, k=128)
B8_DESC = make_descriptors(B8)


@cuda.jit(device=True, forceinline=True)
def _fill(acc, p, t):
    """An accumulator tuple holding ``p``'s elements where the layout puts them."""
    frag = nh.tuple_as_array(acc)
    for r in range(len(acc)):
        frag[r] = p[acc_row(t, r), acc_col(t, r)]
    return nh.array_as_tuple(frag, acc)


@cuda.jit(device=True, forceinline=True)
def _image_to_smem(img, t):
    base = nh.dynamic_shared_base()
    for i in range(t, img.size, 128):
        nh.st_shared_u32(base + 4 * i, img[i])
    nh.fence_proxy_async()
    cuda.syncthreads()
    return base


@cuda.jit(device=True, forceinline=True)
def _finish(o, out, t):
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    res = nh.tuple_as_array(nh.wgmma_fence_operand(o))
    for r in range(32):
        out[t, r] = res[r]


@cuda.jit(launch_bounds=(128, 1))
def _rs_bf16(img, p, out):
    t = np.int32(cuda.threadIdx.x)
    d = V_DESC.at(_image_to_smem(img, t))
    packed = nh.pack_tuple(_fill(nh.wgmma_accumulator(64, "f32"), p, t), "bf16")
    o = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    for kk in range(4):
        o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), V_DESC.k_step(d, kk), 1, "bf16", "bf16", 1, 1, V_TNSP)
    _finish(o, out, t)


@cuda.jit(launch_bounds=(128, 1))
def _rs_f16(img, p, out):
    t = np.int32(cuda.threadIdx.x)
    d = V_DESC.at(_image_to_smem(img, t))
    packed = nh.pack_tuple(_fill(nh.wgmma_accumulator(64, "f32"), p, t), "f16")
    o = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    for kk in range(4):
        o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), V_DESC.k_step(d, kk), 1, "f16", "f16", 1, 1, V_TNSP)
    _finish(o, out, t)


TO_E4M3 = make_a_operand_fp8("e4m3")


@cuda.jit(launch_bounds=(128, 1))
def _rs_e4m3(img, p, out):
    t = np.int32(cuda.threadIdx.x)
    d = B8_DESC.at(_image_to_smem(img, t))
    acc = _fill(nh.wgmma_accumulator(128, "f32"), p, t)  # P: 64 x 128, four k32 slices
    regs = (TO_E4M3(acc, 0, t % 32), TO_E4M3(acc, 1, t % 32), TO_E4M3(acc, 2, t % 32), TO_E4M3(acc, 3, t % 32))
    o = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    for kk in range(4):
        o = nh.wgmma_mma_async_rs(o, regs[kk], B8_DESC.k_step(d, kk), 1, "e4m3", "e4m3", 1, 1, 0)
    _finish(o, out, t)


_RS = {"bf16": _rs_bf16, "f16": _rs_f16, "e4m3": _rs_e4m3}


def _run_rs(dtype, image, p):
    out = cuda.to_device(np.full((128, 32), np.nan, np.float32))
    _RS[dtype][1, 128, 0, image.size](cuda.to_device(image.view(np.uint32)), cuda.to_device(p.astype(np.float32)),
                                      out)
    rows, cols = accumulator_coords(64)
    got = np.full((64, 64), np.nan)
    got[rows, cols] = out.copy_to_host()
    return got


@pytest.mark.parametrize("dtype", ["bf16", "f16", "e4m3"])
def test_accumulator_as_rs_a_operand(dtype):
    """P (an f32 accumulator) times B through the kit's conversion: P's values are exactly
    representable in ``dtype``, so the conversion is exact and the product matches float64."""
    rng = np.random.default_rng()
    if dtype == "e4m3":
        p_codes, p_val = random_operand(rng, "e4m3", (64, 128))
        b_codes, b_val = random_operand(rng, "e4m3", (64, 128))  # B (N x K), K-major
        image = operand_image(b_codes, "K", 128).data
        ref = p_val @ b_val.T
    else:
        p_bits, p_val = random_operand(rng, dtype, (64, 64))
        v_bits, v_val = random_operand(rng, dtype, (64, 64))  # V: 64 keys (K) x 64 (N), row-major
        image = operand_image(np.ascontiguousarray(v_bits.T), "MN", 128).data  # B = V^T (N x K), MN-major
        ref = p_val @ v_val
    # fp8 wgmma sums its exact products with about 14 bits of internal precision: 1e-4 at K = 128.
    assert rel_frobenius(_run_rs(dtype, image, p_val), ref) < (1e-3 if dtype == "e4m3" else TOL), dtype


def test_fp8_operand_rounds_to_the_nearest_e4m3():
    """Values between e4m3 neighbours land on the nearest (the host picks the nearest of the
    finite codes); B = [I | 0] returns P's first 64 columns as converted."""
    codes = np.arange(256, dtype=np.uint8)
    table = fp8_to_f64(codes[(codes & 0x7F) != 0x7F], "e4m3")
    p = np.random.default_rng().uniform(-8, 8, (64, 128)).astype(np.float32).astype(np.float64)
    nearest = table[np.abs(p[..., None] - table).argmin(-1)]
    b = np.zeros((64, 128), np.uint8)
    b[np.arange(64), np.arange(64)] = 0x38  # 1.0
    got = _run_rs("e4m3", operand_image(b, "K", 128).data, p)
    np.testing.assert_array_equal(got, nearest[:, :64])


# --- fast math ------------------------------------------------------------------------------------


@cuda.jit
def _fastmath_kernel(x, y, out, bits):
    i = cuda.grid(1)
    if i < x.size:
        out[0, i] = nh.ex2_approx_ftz(x[i])
        out[1, i] = nh.ex2_approx(x[i])
        out[2, i] = nh.rcp_approx_ftz(y[i])
        out[3, i] = nh.rcp_approx(y[i])
        out[4, i] = nh.lg2_approx_ftz(y[i])
        out[5, i] = nh.fmax(x[i], y[i])
        out[6, i] = nh.fmin(x[i], y[i])
        out[7, i] = nh.fmax_nan(x[i], y[i])
        bits[i] = nh.byte_perm(np.uint32(0x03020100), np.uint32(0x07060504), bits[i])


def test_fast_math_values_and_special_cases():
    rng = np.random.default_rng()
    x = rng.uniform(-20, 20, 1000).astype(np.float32)
    y = rng.uniform(0.01, 100, 1000).astype(np.float32)
    x[:4] = [-np.inf, np.inf, 0, -126.5]
    y[:4] = [np.inf, 0, 1, np.nan]
    x[4] = np.nan
    sel = rng.integers(0, 8, (1000, 4))
    selector = (sel[:, 0] | sel[:, 1] << 4 | sel[:, 2] << 8 | sel[:, 3] << 12).astype(np.uint32)
    out = cuda.to_device(np.full((8, 1000), 12345, np.float32))
    bits = cuda.to_device(selector.copy())
    _fastmath_kernel[8, 128](cuda.to_device(x), cuda.to_device(y), out, bits)
    got = out.copy_to_host().astype(np.float64)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    ok = slice(5, None)
    for row, ref in ((0, 2.0 ** xd), (1, 2.0 ** xd)):
        np.testing.assert_allclose(got[row, ok], ref[ok], rtol=2e-6)
    np.testing.assert_allclose(got[2:4, ok], np.broadcast_to(1 / yd[ok], (2, 995)), rtol=3e-7)
    np.testing.assert_allclose(got[4, ok], np.log2(yd[ok]), rtol=1e-6, atol=1e-6)
    assert list(got[0, :3]) == [0.0, np.inf, 1.0] and got[0, 3] == 0.0  # ex2.ftz: -inf -> 0, a denormal -> 0
    assert math.isclose(got[1, 3], 2.0 ** -126.5, rel_tol=1e-4)  # ex2 without ftz keeps the denormal
    assert got[2, 0] == 0.0 and got[2, 1] == np.inf and got[4, 1] == -np.inf
    np.testing.assert_array_equal(got[5, ok], np.maximum(xd, yd)[ok])
    np.testing.assert_array_equal(got[6, ok], np.minimum(xd, yd)[ok])
    assert got[5, 4] == yd[4] and got[6, 3] == x[3] and math.isnan(got[7, 4])  # max ignores NaN, max.NaN keeps it
    assert got[5, 0] == yd[0]  # fmax(-inf, y) = y
    np.testing.assert_array_equal(bits.copy_to_host(), sel[:, 0] | sel[:, 1] << 8 | sel[:, 2] << 16 | sel[:, 3] << 24)


# --- rings: two independent rings, per-slot bytes ---------------------------------------------------

ROWS, X_COLS, Y_COLS = 32, 32, 16
X_RING = make_ring(3, consumer_arrivals=1, tx_bytes=ROWS * X_COLS * 4)
Y_RING = make_ring(2, consumer_arrivals=1, tx_bytes=0)  # armed per slot with acquire_bytes
X_SLOT, Y_SLOT = ROWS * X_COLS * 4, ROWS * Y_COLS * 4
Y_BASE = 3 * X_SLOT
BARS_X, BARS_Y = Y_BASE + 2 * Y_SLOT, Y_BASE + 2 * Y_SLOT + X_RING.barrier_bytes


@cuda.jit
def _two_rings(map_x, map_y, chunks, out):
    smem = nh.dynamic_shared_base()
    warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
    if cuda.threadIdx.x == 0:
        X_RING.init(smem + BARS_X)
        Y_RING.init(smem + BARS_Y)
    cuda.syncthreads()
    xs, ys = X_RING.start(), Y_RING.start()
    if warp == 0:
        if nh.elect_sync():
            for k in range(chunks):
                full = X_RING.acquire(smem + BARS_X, xs)
                nh.tma_load_2d(smem + xs.stage * X_SLOT, nh.tensormap_param_address(map_x), k * X_COLS, 0, full)
                full = Y_RING.acquire_bytes(smem + BARS_Y, ys, ROWS * Y_COLS * 4)
                nh.tma_load_2d(smem + Y_BASE + ys.stage * Y_SLOT, nh.tensormap_param_address(map_y), k * Y_COLS, 0,
                               full)
                xs, ys = X_RING.advance(xs), Y_RING.advance(ys)
    else:
        total = np.float32(0)
        for k in range(chunks):
            X_RING.wait(smem + BARS_X, xs)
            for c in range(X_COLS):
                total += nh.ld_shared_f32(smem + xs.stage * X_SLOT + 4 * (lane * X_COLS + c))
            Y_RING.wait(smem + BARS_Y, ys)
            for c in range(Y_COLS):
                total += np.float32(2) * nh.ld_shared_f32(smem + Y_BASE + ys.stage * Y_SLOT + 4 * (lane * Y_COLS + c))
            nh.fence_proxy_async()  # the reads are done before TMA refills the slots
            cuda.syncwarp()
            if lane == 0:
                X_RING.release(smem + BARS_X, xs)
                Y_RING.release(smem + BARS_Y, ys)
            xs, ys = X_RING.advance(xs), Y_RING.advance(ys)
        out[lane] = total


def test_two_independent_rings_with_their_own_bytes():
    rng = np.random.default_rng()
    chunks = 37  # not a multiple of either ring's depth: both phases wrap many times
    x = rng.standard_normal((ROWS, chunks * X_COLS)).astype(np.float32)
    y = rng.standard_normal((ROWS, chunks * Y_COLS)).astype(np.float32)
    out = cuda.to_device(np.full(ROWS, np.nan, np.float32))
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)  # (alive while the kernel runs: the maps hold addresses)
    maps = (tensor_map_arg(d_x, (ROWS, X_COLS)), tensor_map_arg(d_y, (ROWS, Y_COLS)))
    launch(_two_rings, 1, 64, (*maps, chunks, out), shared_mem=BARS_Y + Y_RING.barrier_bytes)
    ref = x.astype(np.float64).sum(axis=1) + 2 * y.astype(np.float64).sum(axis=1)
    assert rel_frobenius(out.copy_to_host().astype(np.float64), ref) < 1e-5


# --- ordered barrier and the warp-specialized skeleton ---------------------------------------------

ORDER = make_ordered_barrier(NamedBarriers().allocate("turns", 2), members=2)


@cuda.jit(launch_bounds=(256, 1))
def _take_turns(log, rounds):
    count = cuda.shared.array(1, np.int32)
    member = np.int32(cuda.threadIdx.x // 128)
    if cuda.threadIdx.x == 0:
        count[0] = 0
    cuda.syncthreads()
    ORDER.start(member)
    for _ in range(rounds):
        ORDER.wait(member)
        if cuda.threadIdx.x % 128 == 0:
            log[count[0]] = member
            count[0] += 1
        ORDER.arrive(member)


def test_ordered_barrier_alternates_members():
    log = cuda.to_device(np.full(40, -1, np.int64))
    _take_turns[1, 256](log, 20)
    np.testing.assert_array_equal(log.copy_to_host(), np.arange(40) % 2)


WS2 = warp_specialization(consumers=2, producer_regs=40)
WS_CLUSTER = warp_specialization(consumers=2, producer_regs=56, cluster_size=2)


@cuda.jit(device=True, forceinline=True)
def _role_init(args):
    nh.st_shared_u32(nh.dynamic_shared_base(), 7)


@cuda.jit(device=True, forceinline=True)
def _role_producer(args):
    out, = args
    if cuda.threadIdx.x < 32 and nh.elect_sync():  # the init is visible to every role
        out[cuda.blockIdx.x, 0] = nh.ld_shared_u32(nh.dynamic_shared_base())


@cuda.jit(device=True, forceinline=True)
def _role_consumer(cw, t, args):
    out, = args
    out[cuda.blockIdx.x, 1 + 128 * cw + t] = 1000 * (cw + 1) + t + nh.ld_shared_u32(nh.dynamic_shared_base())


_BODY2, _BODY_CLUSTER = WS2.body(_role_init, _role_producer, _role_consumer), WS_CLUSTER.body(
    _role_init, _role_producer, _role_consumer)


@cuda.jit(launch_bounds=WS2.launch_bounds)
def _roles(out):
    _BODY2((out,))


@cuda.jit(launch_bounds=WS_CLUSTER.launch_bounds)
def _roles_cluster(out):
    _BODY_CLUSTER((out,))


@pytest.mark.parametrize("cluster", [1, 2])
def test_warp_specialized_body_dispatches_every_role(cluster):
    grid = 4
    out = cuda.to_device(np.full((grid, 257), -1, np.int64))
    kernel = _roles if cluster == 1 else _roles_cluster
    launch(kernel, grid, 384, (out,), shared_mem=16, cluster=cluster if cluster > 1 else None)
    want = np.concatenate([[7], 1000 * (np.arange(256) // 128 + 1) + np.arange(256) % 128 + 7])
    np.testing.assert_array_equal(out.copy_to_host(), np.broadcast_to(want, (grid, 257)))


# --- the epilogue: TMA tile stores and the guarded direct store --------------------------------------


@functools.lru_cache(maxsize=None)
def _store_kernel(n, dtype):
    store = make_tile_store(n, dtype, buffers=2)

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_out, direct_out, x, tiles_n):
        t = np.int32(cuda.threadIdx.x)
        row0, col0 = (cuda.blockIdx.x // tiles_n) * 64, (cuda.blockIdx.x % tiles_n) * n
        acc = nh.wgmma_accumulator(n, "f32")
        frag = nh.tuple_as_array(acc)
        rows, cols = x.shape
        for r in range(n // 2):
            i, j = row0 + acc_row(t, r), col0 + acc_col(t, r)
            frag[r] = x[i, j] if i < rows and j < cols else np.float32(0)
        acc = nh.array_as_tuple(frag, acc)
        stores = np.int32(0)
        for _ in range(2):  # twice: the second pass reuses both buffers after their stores read them
            stores = store.tile(acc, nh.dynamic_shared_base(), t, 1, nh.tensormap_param_address(map_out), row0, col0,
                                stores)
        store.drain(t)
        store.direct(acc, direct_out, row0, col0, t)

    return store, kernel


@pytest.mark.parametrize("n, dtype", [(256, "bf16"), (96, "f16"), (64, "f32"), (16, "bf16")])
def test_tile_store_and_direct_store(n, dtype):
    rng = np.random.default_rng()
    M, N = 100, 2 * n - 8  # partial tiles: TMA clips, the direct store checks bounds
    x = rng.standard_normal((M, N)).astype(np.float32)
    if dtype == "f32":
        want, poison, np_t, tma_dtype = x, np.float32(np.nan), np.float32, None
    elif dtype == "bf16":
        want, poison, np_t, tma_dtype = f32_to_bf16_bits(x), 0x7FC0, np.uint16, "bf16"
    else:
        want, poison, np_t, tma_dtype = x.astype(np.float16).view(np.uint16), 0x7E00, np.uint16, "f16"
    store, kernel = _store_kernel(n, dtype)
    out = cuda.to_device(np.full((M, N), poison, np_t))
    direct = cuda.to_device(np.full((M, N), poison, np_t))
    tmap = tensor_map_arg(out, store.box, swizzle=store.swizzle, dtype=tma_dtype)
    tiles_n = -(-N // n)
    d_x = cuda.to_device(x)
    launch(kernel, -(-M // 64) * tiles_n, 128, (tmap, direct, d_x, tiles_n),
           shared_mem=store.buffer_bytes)
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint32 if dtype == "f32" else np.uint16),
                                  np.asarray(want).view(np.uint32 if dtype == "f32" else np.uint16))
    np.testing.assert_array_equal(direct.copy_to_host().view(np.uint32 if dtype == "f32" else np.uint16),
                                  np.asarray(want).view(np.uint32 if dtype == "f32" else np.uint16))


def _doubled_plus_column(out_dtype, cols):
    """Hooks of a store: v = 2x + (its tile column) (fp8: v = x / 2), the bits of |v| tracked."""
    per_block, fp8 = out_dtype in ("bf16", "f16"), out_dtype in ("e4m3", "e5m2")

    @cuda.jit(device=True, forceinline=True)
    def gather(buf, addr, row, col, q, col0):
        c = np.float32(0) if fp8 else np.float32(col0 + q * cols + col)
        if per_block:  # the block's pairs x = 2h + j are columns col + 8h
            return c, c, c + np.float32(8), c + np.float32(8)
        return c

    @cuda.jit(device=True, forceinline=True)
    def pair(frag, k, row, j, col, c, col0):
        if fp8:
            v0, v1 = frag[k] * np.float32(0.5), frag[k + 1] * np.float32(0.5)
        else:
            v0, v1 = frag[k] * np.float32(2) + c, frag[k + 1] * np.float32(2) + (c + np.float32(1))
        return v0, v1, max(nh.abs_bits(v0), nh.abs_bits(v1))

    return TileEpilogue(gather, pair)


@functools.lru_cache(maxsize=None)
def _hooked_store_kernel(dtype, cols):
    store = make_tile_store(64, dtype, buffers=2, cols=cols, epilogue=_doubled_plus_column(dtype, cols))
    chunks = 64 // cols

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_out, amax, x, tiles_n):
        t = np.int32(cuda.threadIdx.x)
        row0, col0 = (cuda.blockIdx.x // tiles_n) * 64, (cuda.blockIdx.x % tiles_n) * 64
        acc = nh.wgmma_accumulator(64, "f32")
        frag = nh.tuple_as_array(acc)
        rows, cols_x = x.shape
        for r in range(32):
            i, j = row0 + acc_row(t, r), col0 + acc_col(t, r)
            frag[r] = x[i, j] if i < rows and j < cols_x else np.float32(0)
        smem, row, m = nh.dynamic_shared_base(), thread_rows(t)[0], np.uint32(0)
        for q in range(chunks):
            buf = smem + (q % 2) * (store.buffer_bytes // 2)
            store.acquire(t == 0, 1)
            m = max(m, store.write(frag, buf, q, row, t % 32, col0))
            store.commit_3d(buf, t == 0, 1, nh.tensormap_param_address(map_out), col0 + q * cols, row0, 0)
        store.drain(t)
        amax[cuda.blockIdx.x, t] = m

    return store, kernel


@pytest.mark.parametrize("dtype, cols", [("bf16", 64), ("f16", 16), ("f32", 32), ("f32", 16), ("e4m3", 64),
                                         ("e5m2", 32)])
def test_tile_store_hooks_map_every_pair(dtype, cols):
    """The sub-tile parts (acquire, write through hooks, commit_3d) against numpy, with the
    hooks' running max of |v| per thread (padding included: the hooks see the whole tile)."""
    rng = np.random.default_rng()
    M, N = 100, 112  # partial tiles: TMA clips the stores (rows of 16-byte multiples, fp8 too)
    tiles_n = -(-N // 64)
    x = rng.uniform(-8, 8, (M, N)).astype(np.float32)
    padded = np.zeros((-(-M // 64) * 64, tiles_n * 64), np.float32)
    padded[:M, :N] = x
    fp8 = dtype in ("e4m3", "e5m2")
    v = padded * np.float32(0.5) if fp8 else padded * np.float32(2) + np.arange(padded.shape[1], dtype=np.float32)
    store, kernel = _hooked_store_kernel(dtype, cols)
    np_t = {"f32": np.float32, "bf16": np.uint16, "f16": np.uint16}.get(dtype, np.uint8)
    out = cuda.to_device(np.full((1, M, N), 0xFF if fp8 else 0x7FC0 if dtype != "f32" else np.nan, np_t))
    amax = cuda.to_device(np.zeros((-(-M // 64) * tiles_n, 128), np.uint32))
    tmap = tensor_map_arg(out, (1,) + store.box, swizzle=store.swizzle, dtype={"bf16": "bf16", "f16": "f16"}.get(dtype))
    launch(kernel, -(-M // 64) * tiles_n, 128, (tmap, amax, cuda.to_device(x), tiles_n),
           shared_mem=store.buffer_bytes)
    got = out.copy_to_host()[0]
    want = v[:M, :N]
    if dtype == "f32":
        np.testing.assert_array_equal(got, want)
    elif dtype == "bf16":
        np.testing.assert_array_equal(got, f32_to_bf16_bits(want))
    elif dtype == "f16":
        np.testing.assert_array_equal(got, want.astype(np.float16).view(np.uint16))
    else:  # a nearest finite code (|v| <= 4 here; either one at a tie)
        codes = np.arange(256, dtype=np.uint8)
        table = fp8_to_f64(codes[(codes & 0x7F) < (0x7F if dtype == "e4m3" else 0x7C)], dtype)
        gap = np.abs(want[..., None].astype(np.float64) - table).min(-1)
        np.testing.assert_array_equal(np.abs(fp8_to_f64(got, dtype) - want), gap)
    assert np.abs(v).max().astype(np.float32).view(np.uint32) == amax.copy_to_host().max()


# --- the tile scheduler ---------------------------------------------------------------------------

SCHED = make_tile_scheduler(128, 256, raster="grouped", group_m=3)


@cuda.jit
def _walk(M, N, batches, owner, where):
    w = SCHED.work(M, N, batches)
    tile = SCHED.first()
    while tile < w.num_tiles:
        o = SCHED.origin(w, tile)
        if cuda.threadIdx.x == 0:
            owner[tile] = cuda.blockIdx.x
            where[tile, 0], where[tile, 1], where[tile, 2] = o.batch, o.m0, o.n0
        tile = SCHED.next(tile)


def test_persistent_walk_covers_every_tile_once_in_grouped_order():
    M, N, batches = 1000, 1900, 2
    tiles_m, tiles_n = -(-M // 128), -(-N // 256)
    total = tiles_m * tiles_n * batches
    owner = cuda.to_device(np.full(total, -1, np.int64))
    where = cuda.to_device(np.full((total, 3), -1, np.int64))
    ctas = 13
    _walk[ctas, 32](M, N, batches, owner, where)
    np.testing.assert_array_equal(owner.copy_to_host(), np.arange(total) % ctas)
    per_batch = tiles_m * tiles_n
    want = [(t // per_batch, *(128 * pm, 256 * pn)) for t in range(total)
            for pm, pn in [grouped_tile_host(t % per_batch, tiles_m, tiles_n, 3)]]
    np.testing.assert_array_equal(where.copy_to_host(), np.array(want))
    assert persistent_grid(total) == min(device_limits(0).sm_count, total)


# --- layouts: TMA loads, descriptors and k-steps of every major and swizzle ---------------------------


@functools.lru_cache(maxsize=None)
def _mma_kernel(a_major, a_swz, b_major, b_swz, n):
    A = operand_layout(a_major, a_swz, "bf16", mn=64, k=64)
    B = operand_layout(b_major, b_swz, "bf16", mn=n, k=64)
    ring = make_ring(1, consumer_arrivals=1, tx_bytes=A.tile_bytes + B.tile_bytes)
    mma, a_desc, b_desc = make_mma(A, B), make_descriptors(A), make_descriptors(B)
    a_loads, b_loads = make_tile_loads(A), make_tile_loads(B)
    store = make_tile_store(n, "f32")
    b_off = A.tile_bytes
    bars = A.tile_bytes + B.tile_bytes

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_a, map_b, out):
        smem = nh.dynamic_shared_base()
        t = np.int32(cuda.threadIdx.x)
        if t == 0:
            ring.init(smem + bars)
        cuda.syncthreads()
        st = ring.start()
        if t == 0:
            full = ring.acquire(smem + bars, st)
            a_loads.load(smem, nh.tensormap_param_address(map_a), 0, 0, full)
            b_loads.load(smem + b_off, nh.tensormap_param_address(map_b), 0, 0, full)
        ring.wait(smem + bars, st)
        acc = mma.k_block(mma.accumulator(), a_desc.at(smem), b_desc.at(smem + b_off), True)
        nh.wgmma_wait_group(0)
        store.direct(nh.wgmma_fence_operand(acc), out, 0, 0, t)

    return A, B, kernel, bars + 16


@pytest.mark.parametrize("a_major, a_swz, b_major, b_swz, n", [
    ("K", 128, "K", 128, 64), ("K", 64, "K", 32, 128), ("K", 32, "MN", 128, 256), ("MN", 128, "MN", 64, 64),
    ("MN", 64, "K", 128, 128), ("MN", 32, "MN", 32, 32), ("K", 128, "MN", 128, 128),
])
def test_descriptors_and_k_steps_of_every_layout(a_major, a_swz, b_major, b_swz, n):
    """A (64 x 64) and B (n x 64) loaded by TMA with the kit's tensor maps and loads, multiplied
    with the kit's descriptors: K-major tiles spanning 1, 2 or 4 boxes along K, MN-major ones
    1 to 8 boxes along MN."""
    rng = np.random.default_rng()
    A, B, kernel, smem = _mma_kernel(a_major, a_swz, b_major, b_swz, n)
    a_bits, a = _bf16(rng, (64, 64))
    b_bits, b = _bf16(rng, (n, 64))
    a_dev = cuda.to_device(a_bits if a_major == "K" else np.ascontiguousarray(a_bits.T))  # (M, K) or (K, M)
    b_dev = cuda.to_device(b_bits if b_major == "K" else np.ascontiguousarray(b_bits.T))  # (N, K) or (K, N)
    out = cuda.to_device(np.full((64, n), np.nan, np.float32))
    launch(kernel, 1, 128, (operand_tensor_map(a_dev, A), operand_tensor_map(b_dev, B), out), shared_mem=smem)
    assert rel_frobenius(out.copy_to_host().astype(np.float64), a @ b.T) < TOL


def test_three_dimensional_operand_map_loads_one_batch():
    """An operand tensor map over a (batch, rows, K) array: ``load_3d`` takes the batch."""
    rng = np.random.default_rng()
    A = operand_layout("K", 128, "bf16", mn=64, k=64)
    B = operand_layout("K", 128, "bf16", mn=64, k=64)
    a_bits, a = _bf16(rng, (3, 64, 64))
    b_bits, b = _bf16(rng, (64, 64))
    ring = make_ring(1, consumer_arrivals=1, tx_bytes=A.tile_bytes + B.tile_bytes)
    mma, desc, loads = make_mma(A, B), make_descriptors(A), make_tile_loads(A)
    store = make_tile_store(64, "f32")

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_a, map_b, batch, out):
        smem = nh.dynamic_shared_base()
        t = np.int32(cuda.threadIdx.x)
        if t == 0:
            ring.init(smem + 16384)
        cuda.syncthreads()
        if t == 0:
            full = ring.acquire(smem + 16384, ring.start())
            loads.load_3d(smem, nh.tensormap_param_address(map_a), 0, 0, batch, full)
            loads.load(smem + 8192, nh.tensormap_param_address(map_b), 0, 0, full)
        ring.wait(smem + 16384, ring.start())
        acc = mma.k_block(mma.accumulator(), desc.at(smem), desc.at(smem + 8192), True)
        nh.wgmma_wait_group(0)
        store.direct(nh.wgmma_fence_operand(acc), out, 0, 0, t)

    out = cuda.to_device(np.full((64, 64), np.nan, np.float32))
    d_a, d_b = cuda.to_device(a_bits), cuda.to_device(b_bits)
    launch(kernel, 1, 128, (operand_tensor_map(d_a, A), operand_tensor_map(d_b, B), 2, out), shared_mem=16384 + 16)
    assert rel_frobenius(out.copy_to_host().astype(np.float64), a[2] @ b.T) < TOL


@functools.lru_cache(maxsize=None)
def _ldmatrix_kernel(swizzle):
    A = operand_layout("K", swizzle, "bf16", mn=64, k=64)
    B = operand_layout("K", 128, "bf16", mn=64, k=64)
    ring = make_ring(1, consumer_arrivals=1, tx_bytes=A.tile_bytes + B.tile_bytes)
    a_loads, b_loads, b_desc = make_tile_loads(A), make_tile_loads(B), make_descriptors(B)
    load_a = make_a_loader(A)
    store = make_tile_store(64, "f32")

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(map_a, map_b, out):
        smem = nh.dynamic_shared_base()
        t = np.int32(cuda.threadIdx.x)
        if t == 0:
            ring.init(smem + 16384)
        cuda.syncthreads()
        if t == 0:
            full = ring.acquire(smem + 16384, ring.start())
            a_loads.load(smem, nh.tensormap_param_address(map_a), 0, 0, full)
            b_loads.load(smem + 8192, nh.tensormap_param_address(map_b), 0, 0, full)
        ring.wait(smem + 16384, ring.start())
        a = (load_a(smem, t, 0), load_a(smem, t, 1), load_a(smem, t, 2), load_a(smem, t, 3))
        d = b_desc.at(smem + 8192)
        acc = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
        nh.wgmma_fence()
        for kk in range(4):
            acc = nh.wgmma_mma_async_rs(acc, a[kk], b_desc.k_step(d, kk), 1, "bf16", "bf16", 1, 1, 0)
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        store.direct(nh.wgmma_fence_operand(acc), out, 0, 0, t)

    return A, B, kernel


@pytest.mark.parametrize("swizzle", [128, 64, 32])
def test_a_operand_loaded_by_ldmatrix_from_a_swizzled_tile(swizzle):
    rng = np.random.default_rng()
    A, B, kernel = _ldmatrix_kernel(swizzle)
    a_bits, a = _bf16(rng, (64, 64))
    b_bits, b = _bf16(rng, (64, 64))
    out = cuda.to_device(np.full((64, 64), np.nan, np.float32))
    d_a, d_b = cuda.to_device(a_bits), cuda.to_device(b_bits)
    launch(kernel, 1, 128, (operand_tensor_map(d_a, A), operand_tensor_map(d_b, B), out), shared_mem=16384 + 16)
    assert rel_frobenius(out.copy_to_host().astype(np.float64), a @ b.T) < TOL


A_SHARED = operand_layout("K", 128, "bf16", mn=128, k=64)
A_PARTS = make_tile_loads(A_SHARED, parts=2)
SHARED_RING = make_ring(1, consumer_arrivals=1, tx_bytes=A_SHARED.tile_bytes)


@cuda.jit
def _multicast_halves(map_a, out):
    smem = nh.dynamic_shared_base()
    bars = smem + A_SHARED.tile_bytes
    t = cuda.threadIdx.x
    if t == 0:
        SHARED_RING.init(bars)
    nh.cluster_sync()  # both CTAs' barriers exist before either multicasts
    if t == 0:
        full = SHARED_RING.acquire(bars, SHARED_RING.start())  # the whole tile: this CTA's half and its peer's
        A_PARTS.load_part(smem, nh.tensormap_param_address(map_a), (cuda.blockIdx.x // 2) * 128, 0, full,
                          nh.cluster_ctarank(), 0b11)
    SHARED_RING.wait(bars, SHARED_RING.start())
    for i in range(t, A_SHARED.tile_bytes // 4, cuda.blockDim.x):
        out[cuda.blockIdx.x, i] = nh.ld_shared_u32(smem + 4 * i)
    nh.cluster_sync()  # no CTA exits while its peer may still write into it


def test_multicast_parts_assemble_the_whole_tile_in_every_cta():
    rng = np.random.default_rng()
    a_bits, _ = _bf16(rng, (256, 64))
    out = cuda.to_device(np.zeros((4, A_SHARED.tile_bytes // 4), np.uint32))
    d_a = cuda.to_device(a_bits)
    tmap = operand_tensor_map(d_a, A_SHARED, parts=2)
    launch(_multicast_halves, 4, 128, (tmap, out), shared_mem=A_SHARED.tile_bytes + 16, cluster=2)
    got = out.copy_to_host()
    for cta in range(4):
        tile = a_bits[128 * (cta // 2):128 * (cta // 2) + 128]
        np.testing.assert_array_equal(got[cta], operand_image(tile, "K", 128).data.view(np.uint32))
