"""The intrinsics on a Hopper GPU, against numpy (marked gpu: skipped without one).

Every test uses fresh random data and poisons its outputs first (NaN, or a value the
kernel cannot produce), so an output a kernel failed to write fails the comparison.
Float results are compared by relative Frobenius error against a float64 reference
computed from the exact values of the rounded inputs; integer results exactly.
"""

import functools

import numpy as np
import pytest
from numba import cuda

from _ref import (
    ELEM_BYTES,
    a_fragment,
    f32_to_bf16_bits,
    ldmatrix_expected,
    operand_image,
    random_operand,
    rel_frobenius,
    unpack_accumulator,
)
from numba_hopper import intrinsics as nh
from numba_hopper.tools.sass import inspect_kernel

pytestmark = pytest.mark.gpu

POISON_U32 = 0x7E007E00  # two f16 NaNs
POISON_S32 = -(2**31)  # no s8/u8 product sum of these sizes reaches it
TOL = 1e-2


def _poisoned(shape, kind):
    if kind == "f32":
        return cuda.to_device(np.full(shape, np.nan, np.float32))
    if kind == "f16":
        return cuda.to_device(np.full(shape, POISON_U32, np.uint32))
    return cuda.to_device(np.full(shape, POISON_S32, np.int32))


def _nreg(n, acc_kind):
    return n // (4 if acc_kind == "f16" else 2)


def _check_d(out, n, acc_kind, ref):
    d = unpack_accumulator(out, n, acc_kind)
    assert not np.isnan(d).any(), "accumulator registers left unwritten (poison survived)"
    if acc_kind == "s32":
        np.testing.assert_array_equal(d, ref)
    else:
        err = rel_frobenius(d, ref)
        assert err < TOL, f"relative Frobenius error {err:.3g}"


# --- wgmma, SS mode --------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _ss_kernel(n, acc_kind, at, bt, ta, tb, sa=1, sb=1):
    """Copy a prepared shared-memory image, then ``ksteps`` SS wgmmas into one accumulator.

    Descriptors are built on the device (matrix_descriptor) from run-time fields.
    """
    nreg = _nreg(n, acc_kind)

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(img, b_off, lbo_a, sbo_a, swz_a, step_a, lbo_b, sbo_b, swz_b, step_b, ksteps, out):
        base = nh.dynamic_shared_base()
        t = cuda.threadIdx.x
        for i in range(t, img.size, 128):
            nh.st_shared_u32(base + 4 * i, img[i])
        nh.fence_proxy_async()  # generic-proxy stores -> async-proxy (wgmma) reads
        cuda.syncthreads()
        acc = nh.wgmma_accumulator(n, acc_kind)
        nh.wgmma_fence()
        for s in range(ksteps):
            da = nh.matrix_descriptor(base + s * step_a, lbo_a, sbo_a, swz_a, 0)
            db = nh.matrix_descriptor(base + b_off + s * step_b, lbo_b, sbo_b, swz_b, 0)
            acc = nh.wgmma_mma_async(acc, da, db, s, at, bt, sa, sb, ta, tb)  # s == 0: overwrite
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        for r in range(nreg):
            out[t, r] = acc[r]

    return kernel


def _k_extent(kind, major, swz):
    """K (elements) a tile of this layout holds; None when free (then 64 bytes / 32 rows)."""
    if major == "K" and swz:
        return swz // ELEM_BYTES[kind]
    return None


def run_ss(at, bt, acc_kind, n, a_major="K", b_major="K", swz_a=128, swz_b=128, sa=1, sb=1):
    rng = np.random.default_rng()
    e = ELEM_BYTES[at]
    ks = {x for x in (_k_extent(at, a_major, swz_a), _k_extent(bt, b_major, swz_b)) if x}
    assert len(ks) <= 1, "K-major swizzled A and B must have the same K extent"
    k = ks.pop() if ks else 64 // e
    a_bits, a_val = random_operand(rng, at, (64, k))
    b_bits, b_val = random_operand(rng, bt, (n, k))
    img_a = operand_image(a_bits, a_major, swz_a)
    img_b = operand_image(b_bits, b_major, swz_b)
    assert img_a.ksteps == img_b.ksteps == k * e // 32
    image = np.concatenate([img_a.data, img_b.data]).view(np.uint32)
    out = _poisoned((128, _nreg(n, acc_kind)), acc_kind)
    kernel = _ss_kernel(n, acc_kind, at, bt, int(a_major == "MN"), int(b_major == "MN"), sa, sb)
    kernel[1, 128, 0, image.nbytes](
        cuda.to_device(image), img_a.data.size,
        img_a.lbo, img_a.sbo, swz_a, img_a.step_bytes,
        img_b.lbo, img_b.sbo, swz_b, img_b.step_bytes,
        img_a.ksteps, out,
    )
    _check_d(out.copy_to_host(), n, acc_kind, (sa * a_val) @ (sb * b_val).T)


SS_FAMILIES = [
    ("bf16", "bf16", "f32"),
    ("f16", "f16", "f32"),
    ("f16", "f16", "f16"),
    ("tf32", "tf32", "f32"),
    ("e4m3", "e4m3", "f32"),
    ("e5m2", "e5m2", "f32"),
    ("e4m3", "e5m2", "f16"),
    ("s8", "s8", "s32"),
    ("u8", "u8", "s32"),
    ("s8", "u8", "s32"),
]


@pytest.mark.parametrize("n", [8, 64, 128, 256])
@pytest.mark.parametrize("at, bt, acc_kind", SS_FAMILIES)
def test_wgmma_ss_every_family(at, bt, acc_kind, n):
    # K-major, 128-byte swizzle (the GEMM's layout): K = 128 bytes, 4 wgmma K-steps.
    run_ss(at, bt, acc_kind, n)


@pytest.mark.parametrize("swz", [0, 32, 64, 128])
def test_wgmma_descriptor_swizzle_modes_k_major(swz):
    run_ss("bf16", "bf16", "f32", 64, swz_a=swz, swz_b=swz)


@pytest.mark.parametrize("swz", [0, 32, 64, 128])
def test_wgmma_transposed_16_bit_operands(swz):
    # Both operands MN-major (imm-trans-a = imm-trans-b = 1), f16 in, f32 and f16 out.
    run_ss("f16", "f16", "f32", 128, a_major="MN", b_major="MN", swz_a=swz, swz_b=swz)
    run_ss("f16", "f16", "f16", 64, a_major="MN", b_major="MN", swz_a=swz, swz_b=swz)


@pytest.mark.parametrize(
    "a_major, swz_a, b_major, swz_b, n",
    [("K", 128, "MN", 128, 128), ("MN", 64, "K", 0, 256), ("MN", 0, "MN", 128, 192), ("K", 0, "MN", 32, 64)],
)
def test_wgmma_mixed_majors_bf16(a_major, swz_a, b_major, swz_b, n):
    run_ss("bf16", "bf16", "f32", n, a_major=a_major, b_major=b_major, swz_a=swz_a, swz_b=swz_b)


@pytest.mark.parametrize("sa, sb", [(-1, 1), (1, -1), (-1, -1)])
def test_wgmma_negate_immediates(sa, sb):
    run_ss("bf16", "bf16", "f32", 64, sa=sa, sb=sb)
    run_ss("e4m3", "e5m2", "f32", 32, sa=sa, sb=sb)


@functools.lru_cache(maxsize=None)
def _twice_kernel():
    @cuda.jit(launch_bounds=(128, 1))
    def kernel(img, b_off, scale_d, out):
        base = nh.dynamic_shared_base()
        t = cuda.threadIdx.x
        for i in range(t, img.size, 128):
            nh.st_shared_u32(base + 4 * i, img[i])
        nh.fence_proxy_async()
        cuda.syncthreads()
        acc = nh.wgmma_accumulator(64, "f32")
        da = nh.matrix_descriptor(base, 16, 256, 32, 0)
        db = nh.matrix_descriptor(base + b_off, 16, 256, 32, 0)
        nh.wgmma_fence()
        acc = nh.wgmma_mma_async(acc, da, db, 1, "bf16", "bf16", 1, 1, 0, 0)  # 0 + AB
        acc = nh.wgmma_mma_async(acc, da, db, scale_d, "bf16", "bf16", 1, 1, 0, 0)
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        for r in range(32):
            out[t, r] = acc[r]

    return kernel


@pytest.mark.parametrize("scale_d", [0, 1, 7])
def test_wgmma_scale_d_is_a_run_time_predicate(scale_d):
    rng = np.random.default_rng()
    a_bits, a_val = random_operand(rng, "bf16", (64, 16))
    b_bits, b_val = random_operand(rng, "bf16", (64, 16))
    img_a, img_b = operand_image(a_bits, "K", 32), operand_image(b_bits, "K", 32)
    image = np.concatenate([img_a.data, img_b.data]).view(np.uint32)
    out = _poisoned((128, 32), "f32")
    _twice_kernel()[1, 128, 0, image.nbytes](cuda.to_device(image), img_a.data.size, scale_d, out)
    factor = 2.0 if scale_d else 1.0  # nonzero: D += AB; zero: D = AB
    _check_d(out.copy_to_host(), 64, "f32", factor * (a_val @ b_val.T))


# --- wgmma, RS mode ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _rs_kernel(n, acc_kind, at, bt, tb):
    nreg = _nreg(n, acc_kind)

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(img, frag, lbo_b, sbo_b, swz_b, out):
        base = nh.dynamic_shared_base()
        t = cuda.threadIdx.x
        for i in range(t, img.size, 128):
            nh.st_shared_u32(base + 4 * i, img[i])
        nh.fence_proxy_async()
        cuda.syncthreads()
        a = (frag[t, 0], frag[t, 1], frag[t, 2], frag[t, 3])
        acc = nh.wgmma_accumulator(n, acc_kind)
        nh.wgmma_fence()  # orders the A registers (and acc) written above
        db = nh.matrix_descriptor(base, lbo_b, sbo_b, swz_b, 0)
        acc = nh.wgmma_mma_async_rs(acc, a, db, 0, at, bt, 1, 1, tb)
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        for r in range(nreg):
            out[t, r] = acc[r]

    return kernel


@pytest.mark.parametrize(
    "at, bt, acc_kind, n, b_major, swz",
    [
        ("bf16", "bf16", "f32", 8, "K", 32),
        ("bf16", "bf16", "f32", 256, "K", 0),
        ("f16", "f16", "f16", 128, "K", 32),
        ("f16", "f16", "f32", 64, "MN", 128),  # transposed B in RS mode
        ("bf16", "bf16", "f32", 128, "MN", 0),
        ("tf32", "tf32", "f32", 64, "K", 32),
        ("e4m3", "e5m2", "f32", 128, "K", 32),
        ("e5m2", "e5m2", "f16", 64, "K", 0),
        ("s8", "u8", "s32", 64, "K", 32),
        ("u8", "s8", "s32", 256, "K", 0),
    ],
)
def test_wgmma_rs_with_fragment_built_on_the_host(at, bt, acc_kind, n, b_major, swz):
    rng = np.random.default_rng()
    k = 32 // ELEM_BYTES[at]  # one K-step
    a_bits, a_val = random_operand(rng, at, (64, k))
    b_bits, b_val = random_operand(rng, bt, (n, k))
    img_b = operand_image(b_bits, b_major, swz)
    assert img_b.ksteps == 1
    out = _poisoned((128, _nreg(n, acc_kind)), acc_kind)
    kernel = _rs_kernel(n, acc_kind, at, bt, int(b_major == "MN"))
    kernel[1, 128, 0, img_b.data.size](
        cuda.to_device(img_b.data.view(np.uint32)), cuda.to_device(a_fragment(a_bits)),
        img_b.lbo, img_b.sbo, swz, out,
    )
    _check_d(out.copy_to_host(), n, acc_kind, a_val @ b_val.T)


@functools.lru_cache(maxsize=None)
def _rs_ldmatrix_kernel(n):
    @cuda.jit(launch_bounds=(128, 1))
    def kernel(img, a_off, out):
        base = nh.dynamic_shared_base()
        t = cuda.threadIdx.x
        for i in range(t, img.size, 128):
            nh.st_shared_u32(base + 4 * i, img[i])
        nh.fence_proxy_async()
        cuda.syncthreads()
        # A is a plain row-major 64 x 16 bf16 tile (32-byte rows) at a_off. Warp w loads
        # rows 16w..16w+15: lanes 0-7 / 8-15 / 16-23 / 24-31 address the rows of matrix
        # 0 (rows 0-7, k 0-7), 1 (rows 8-15, k 0-7), 2 (rows 0-7, k 8-15), 3 (rows 8-15, k 8-15).
        w, lane = t // 32, t % 32
        row = 16 * w + lane % 8 + 8 * ((lane // 8) % 2)
        a = nh.ldmatrix_x4(base + a_off + 32 * row + 16 * (lane // 16))
        acc = nh.wgmma_accumulator(n, "f32")
        nh.wgmma_fence()
        acc = nh.wgmma_mma_async_rs(acc, a, nh.matrix_descriptor(base, 16, 256, 32, 0), 0,
                                    "bf16", "bf16", 1, 1, 0)
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        for r in range(n // 2):
            out[t, r] = acc[r]

    return kernel


@pytest.mark.parametrize("n", [64, 256])
def test_wgmma_rs_with_a_loaded_by_ldmatrix(n):
    rng = np.random.default_rng()
    a_bits, a_val = random_operand(rng, "bf16", (64, 16))
    b_bits, b_val = random_operand(rng, "bf16", (n, 16))
    img_b = operand_image(b_bits, "K", 32)
    a_plain = np.zeros(4096, np.uint8)
    a_plain[:2048] = a_bits.view(np.uint8).ravel()
    image = np.concatenate([img_b.data, a_plain]).view(np.uint32)
    out = _poisoned((128, n // 2), "f32")
    _rs_ldmatrix_kernel(n)[1, 128, 0, image.nbytes](cuda.to_device(image), img_b.data.size, out)
    _check_d(out.copy_to_host(), n, "f32", a_val @ b_val.T)


# --- ldmatrix / stmatrix / pack ---------------------------------------------------------------

LD_VARIANTS = [(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)]


@cuda.jit(launch_bounds=(32, 1))
def _ldmatrix_kernel(tile_words, out):
    tile = cuda.shared.array(128, np.uint32, alignment=128)
    lane = cuda.threadIdx.x
    for i in range(4):
        tile[4 * lane + i] = tile_words[4 * lane + i]
    cuda.syncwarp()
    row = nh.shared_address(tile) + 16 * lane  # lane l points at row l
    a = nh.ldmatrix_x1(row)
    b = nh.ldmatrix_x2(row)
    c = nh.ldmatrix_x4(row)
    d = nh.ldmatrix_x1_trans(row)
    e = nh.ldmatrix_x2_trans(row)
    f = nh.ldmatrix_x4_trans(row)
    out[0, lane, 0] = a[0]
    for i in range(2):
        out[1, lane, i] = b[i]
        out[4, lane, i] = e[i]
    for i in range(4):
        out[2, lane, i] = c[i]
        out[5, lane, i] = f[i]
    out[3, lane, 0] = d[0]


def test_ldmatrix_plain_and_transposed():
    rng = np.random.default_rng()
    tile = rng.integers(0, 1 << 16, (32, 8)).astype(np.uint16)
    out = cuda.to_device(np.full((6, 32, 4), 0xDEADBEEF, np.uint32))
    _ldmatrix_kernel[1, 32](cuda.to_device(tile.view(np.uint32).ravel()), out)
    got = out.copy_to_host()
    for v, (num, trans) in enumerate(LD_VARIANTS):
        np.testing.assert_array_equal(got[v, :, :num], ldmatrix_expected(tile, num, trans), err_msg=str((num, trans)))


@cuda.jit(launch_bounds=(32, 1))
def _stmatrix_kernel(regs, smem_out, back):
    buf = cuda.shared.array(6 * 128, np.uint32, alignment=128)
    lane = cuda.threadIdx.x
    for v in range(6):
        for i in range(4):
            buf[128 * v + 4 * lane + i] = 0xDEADBEEF
    cuda.syncwarp()
    base = nh.shared_address(buf) + 16 * lane
    r0, r1, r2, r3 = regs[lane, 0], regs[lane, 1], regs[lane, 2], regs[lane, 3]
    nh.stmatrix_x1(base, r0)
    nh.stmatrix_x2(base + 512, r0, r1)
    nh.stmatrix_x4(base + 1024, r0, r1, r2, r3)
    nh.stmatrix_x1_trans(base + 1536, r0)
    nh.stmatrix_x2_trans(base + 2048, r0, r1)
    nh.stmatrix_x4_trans(base + 2560, r0, r1, r2, r3)
    cuda.syncwarp()
    for v in range(6):
        for i in range(4):
            smem_out[v, 4 * lane + i] = buf[128 * v + 4 * lane + i]
    # round trip: load each back with the matching ldmatrix
    back[0, lane, 0] = nh.ldmatrix_x1(base)[0]
    b = nh.ldmatrix_x2(base + 512)
    c = nh.ldmatrix_x4(base + 1024)
    back[3, lane, 0] = nh.ldmatrix_x1_trans(base + 1536)[0]
    e = nh.ldmatrix_x2_trans(base + 2048)
    f = nh.ldmatrix_x4_trans(base + 2560)
    for i in range(2):
        back[1, lane, i] = b[i]
        back[4, lane, i] = e[i]
    for i in range(4):
        back[2, lane, i] = c[i]
        back[5, lane, i] = f[i]


def _stmatrix_expected(regs, num, trans):
    tile = np.full((32, 8), 0xBEEF, np.uint16)  # rows past 8*num keep the poison's low half
    tile[8 * num:] = np.array([0xDEADBEEF], np.uint32).view(np.uint16)[np.arange(8) % 2]
    for lane in range(32):
        for i in range(num):
            lo, hi = int(regs[lane, i]) & 0xFFFF, int(regs[lane, i]) >> 16
            r, c = lane // 4, 2 * (lane % 4)
            if trans:
                tile[8 * i + c, r], tile[8 * i + c + 1, r] = lo, hi
            else:
                tile[8 * i + r, c], tile[8 * i + r, c + 1] = lo, hi
    return tile


def test_stmatrix_plain_and_transposed_and_round_trip():
    rng = np.random.default_rng()
    regs = rng.integers(0, 1 << 32, (32, 4), dtype=np.uint64).astype(np.uint32)
    smem_out = cuda.to_device(np.zeros((6, 128), np.uint32))
    back = cuda.to_device(np.full((6, 32, 4), 0xDEADBEEF, np.uint32))
    _stmatrix_kernel[1, 32](cuda.to_device(regs), smem_out, back)
    got, got_back = smem_out.copy_to_host(), back.copy_to_host()
    for v, (num, trans) in enumerate(LD_VARIANTS):
        tile = got[v].view(np.uint16).reshape(32, 8)
        np.testing.assert_array_equal(tile, _stmatrix_expected(regs, num, trans), err_msg=str((num, trans)))
        np.testing.assert_array_equal(got_back[v, :, :num], regs[:, :num], err_msg=str((num, trans)))


@cuda.jit
def _pack_kernel(lo, hi, bf, hf):
    i = cuda.grid(1)
    if i < lo.size:
        bf[i] = nh.pack_bf16x2(lo[i], hi[i])
        hf[i] = nh.pack_f16x2(lo[i], hi[i])


def test_pack_bf16x2_and_f16x2_round_to_nearest_even_lo_in_low_half():
    rng = np.random.default_rng()
    lo = (rng.standard_normal(4096) * 100).astype(np.float32)
    hi = (rng.standard_normal(4096) * 100).astype(np.float32)
    bf = cuda.to_device(np.zeros(4096, np.uint32))
    hf = cuda.to_device(np.zeros(4096, np.uint32))
    _pack_kernel[16, 256](cuda.to_device(lo), cuda.to_device(hi), bf, hf)
    want_bf = f32_to_bf16_bits(lo).astype(np.uint32) | (f32_to_bf16_bits(hi).astype(np.uint32) << 16)
    want_hf = lo.astype(np.float16).view(np.uint16).astype(np.uint32) | (
        hi.astype(np.float16).view(np.uint16).astype(np.uint32) << 16)
    np.testing.assert_array_equal(bf.copy_to_host(), want_bf)
    np.testing.assert_array_equal(hf.copy_to_host(), want_hf)


@cuda.jit
def _fp8_kernel(lo, hi, e4m3, e5m2, bits, warp_max):
    i = cuda.grid(1)
    if i < lo.size:
        e4m3[i] = nh.pack_e4m3x2(lo[i], hi[i])
        e5m2[i] = nh.pack_e5m2x2(lo[i], hi[i])
        bits[i] = nh.abs_bits(lo[i])
        warp_max[i] = nh.redux_sync_max_u32(nh.abs_bits(lo[i]))


def test_fp8_pack_matches_torch_and_warp_max_of_abs_bits():
    """e4m3/e5m2 pairs round as torch's conversion does once saturated (lo in the low byte);
    the bits of |x| order as |x|, so the warp's integer max is the bits of its largest |x|."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    n = 4096
    lo = (rng.standard_normal(n) * 300).astype(np.float32)
    hi = (rng.standard_normal(n) * 300).astype(np.float32)
    lo[:4] = (1000.0, -1000.0, 1e5, np.nan)  # saturated by both, beyond e5m2's range, NaN
    outs = [cuda.to_device(np.full(n, 0xDEAD, np.uint16)) for _ in range(2)]
    bits, warp_max = (cuda.to_device(np.zeros(n, np.uint32)) for _ in range(2))
    _fp8_kernel[16, 256](cuda.to_device(lo), cuda.to_device(hi), *outs, bits, warp_max)
    for got, dtype, largest in zip(outs, (torch.float8_e4m3fn, torch.float8_e5m2), (448.0, 57344.0)):
        def fp8(x):
            return torch.from_numpy(x).clamp(-largest, largest).to(dtype).view(torch.uint8)

        want = fp8(lo).numpy().astype(np.uint16) | (fp8(hi).numpy().astype(np.uint16) << 8)
        got = got.copy_to_host()
        nan = np.isnan(lo)
        np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=str(dtype))
        low = torch.from_numpy((got[nan] & 0xFF).astype(np.uint8)).view(dtype).float()
        assert torch.isnan(low).all()
    np.testing.assert_array_equal(bits.copy_to_host(), np.abs(lo).view(np.uint32))
    per_warp = np.abs(lo).view(np.uint32).reshape(-1, 32).max(axis=1)
    np.testing.assert_array_equal(warp_max.copy_to_host().reshape(-1, 32), np.repeat(per_warp[:, None], 32, 1))


# --- shared memory ------------------------------------------------------------------------------


@cuda.jit(launch_bounds=(128, 1))
def _smem_kernel(out):
    static = cuda.shared.array(40, np.float32)  # 160 B of static shared memory
    t = cuda.threadIdx.x
    static[t % 40] = t
    base = nh.dynamic_shared_base()
    view = nh.shared_array(256, (4, 8), np.uint32)
    if t < 32:
        view[t // 8, t % 8] = 3 * t
    cuda.syncthreads()
    if t == 0:
        out[0] = base
        out[1] = nh.shared_address(static)
        out[2] = nh.shared_address(static[4:]) - nh.shared_address(static)
        out[3] = nh.shared_address(view) - base
    if t < 32:
        out[8 + t] = nh.ld_shared_u32(base + 256 + 4 * t)


def test_dynamic_shared_base_is_1024_aligned_after_static_smem_and_views_land_there():
    out = cuda.to_device(np.full(40, 0xFFFFFFFF, np.uint32))
    _smem_kernel[1, 128, 0, 2048](out)
    got = out.copy_to_host()
    base, static = int(got[0]), int(got[1])
    assert base % 1024 == 0, hex(base)
    assert base >= static + 160 or static >= base + 2048, (hex(base), hex(static))  # no overlap
    assert got[2] == 16 and got[3] == 256
    np.testing.assert_array_equal(got[8:40], 3 * np.arange(32))


# --- mbarrier -----------------------------------------------------------------------------------


@cuda.jit(launch_bounds=(128, 1))
def _phase_kernel(flags, mismatches, nphases):
    bars = cuda.shared.array(2, np.uint64)
    data = cuda.shared.array(128, np.int32)
    t = cuda.threadIdx.x
    single = nh.shared_address(bars)
    every = single + 8
    if t == 0:
        nh.mbarrier_init(single, 1)
        nh.mbarrier_init(every, 128)
    cuda.syncthreads()
    bad = 0
    for p in range(nphases):
        parity = p & 1
        if t == 0:
            # One arrival completes a phase of `single`: watch its parity flip.
            flags[p, 0] = nh.mbarrier_test_wait_parity(single, parity)  # False: phase p open
            flags[p, 1] = nh.mbarrier_test_wait_parity(single, parity ^ 1)  # True: p-1 done
            nh.mbarrier_arrive(single)
            flags[p, 2] = nh.mbarrier_test_wait_parity(single, parity)  # True: phase p done
            flags[p, 3] = nh.mbarrier_try_wait_parity(single, parity)  # True
            flags[p, 4] = nh.mbarrier_test_wait_parity(single, parity ^ 1)  # False: p+1 open
            nh.mbarrier_wait_parity(single, parity)  # returns at once
        # All 128 threads: write, arrive (release), wait (acquire), read a neighbour's write.
        if t % 32 == 5:
            cuda.nanosleep(2000)  # late arrivals: the others really spin
        data[t] = 1000 * p + t
        nh.mbarrier_arrive(every)
        nh.mbarrier_wait_parity(every, parity)
        if data[(t + 33) % 128] != 1000 * p + (t + 33) % 128:
            bad += 1
        cuda.syncthreads()  # nobody overwrites data before everyone has read it
    mismatches[t] = bad


def test_mbarrier_phases_flip():
    nphases = 6
    flags = cuda.to_device(np.full((nphases, 5), 7, np.uint8))
    mismatches = cuda.to_device(np.full(128, -1, np.int32))
    _phase_kernel[1, 128](flags, mismatches, nphases)
    got = flags.copy_to_host()
    np.testing.assert_array_equal(got, np.tile([0, 1, 1, 1, 0], (nphases, 1)))
    np.testing.assert_array_equal(mismatches.copy_to_host(), 0)


@cuda.jit(launch_bounds=(64, 1))
def _tx_kernel(flags, released):
    bars = cuda.shared.array(2, np.uint64)
    t = cuda.threadIdx.x
    bar = nh.shared_address(bars)
    ack = bar + 8
    if t == 0:
        nh.mbarrier_init(bar, 1)
        nh.mbarrier_init(ack, 1)
    cuda.syncthreads()
    if t == 0:
        # phase 0: the one arrival comes with 64 expected bytes; the phase stays open
        nh.mbarrier_arrive_expect_tx(bar, 64)
        flags[0] = nh.mbarrier_test_wait_parity(bar, 0)  # False
        nh.mbarrier_complete_tx(bar, 32)
        flags[1] = nh.mbarrier_test_wait_parity(bar, 0)  # False: 32 bytes still due
        nh.mbarrier_complete_tx(bar, 32)
        flags[2] = nh.mbarrier_test_wait_parity(bar, 0)  # True
        # Parity waits cannot tell phase 0 from phase 2: let the waiter see phase 0 first.
        nh.mbarrier_wait_parity(ack, 0)
        # phase 1: expect_tx first (no arrival), then the arrival, then the bytes
        nh.mbarrier_expect_tx(bar, 16)
        nh.mbarrier_arrive(bar)
        flags[3] = nh.mbarrier_test_wait_parity(bar, 1)  # False: 16 bytes due
        nh.mbarrier_complete_tx(bar, 16)
        flags[4] = nh.mbarrier_test_wait_parity(bar, 1)  # True
    elif t == 32:
        # another warp spins on each phase; it is released only once the bytes came
        nh.mbarrier_wait_parity(bar, 0)
        released[0] = 1
        nh.mbarrier_arrive(ack)
        nh.mbarrier_wait_parity(bar, 1)
        released[1] = 1
    cuda.syncthreads()
    if t == 0:
        nh.mbarrier_inval(bar)
        nh.mbarrier_inval(ack)


def test_mbarrier_phase_held_open_by_expect_tx_until_complete_tx():
    flags = cuda.to_device(np.full(5, 7, np.uint8))
    released = cuda.to_device(np.zeros(2, np.int32))
    _tx_kernel[1, 64](flags, released)
    np.testing.assert_array_equal(flags.copy_to_host(), [0, 0, 1, 0, 1])
    np.testing.assert_array_equal(released.copy_to_host(), [1, 1])


@cuda.jit(launch_bounds=(64, 1))
def _cluster_arrive_kernel(flags):
    # A plain launch is a cluster of one CTA: its own shared::cta address is a valid
    # shared::cluster address, and mapa(bar, 0) maps onto itself.
    bars = cuda.shared.array(1, np.uint64)
    t = cuda.threadIdx.x
    bar = nh.shared_address(bars)
    if t == 0:
        nh.mbarrier_init(bar, 2)
        nh.fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        nh.mbarrier_arrive_cluster(bar)
        flags[0] = nh.mbarrier_test_wait_parity(bar, 0)  # False: one of two arrivals
    cuda.syncthreads()
    if t == 32:
        nh.mbarrier_arrive_cluster_rank(bar, 0)
    nh.mbarrier_wait_parity(bar, 0)
    if t == 0:
        flags[1] = nh.mbarrier_test_wait_parity(bar, 0)  # True


def test_mbarrier_cluster_arrivals_in_a_one_cta_cluster():
    flags = cuda.to_device(np.full(2, 7, np.uint8))
    _cluster_arrive_kernel[1, 64](flags)
    np.testing.assert_array_equal(flags.copy_to_host(), [0, 1])


# --- sync ---------------------------------------------------------------------------------------


@cuda.jit(launch_bounds=(256, 1))
def _elect_kernel(counts, lanes):
    t = cuda.threadIdx.x
    if nh.elect_sync():
        cuda.atomic.add(counts, t // 32, 1)
        lanes[t // 32] = t % 32


def test_elect_sync_picks_one_lane_per_warp():
    counts = cuda.to_device(np.zeros(8, np.int32))
    lanes = cuda.to_device(np.full(8, -1, np.int32))
    _elect_kernel[3, 256](counts, lanes)
    np.testing.assert_array_equal(counts.copy_to_host(), 3)  # one per warp per block (3 blocks)
    got = lanes.copy_to_host()
    assert np.all((got >= 0) & (got < 32)), got


@cuda.jit(launch_bounds=(256, 1))
def _named_barrier_kernel(out, rounds):
    buf = cuda.shared.array(128, np.int32)
    t = cuda.threadIdx.x
    for r in range(rounds):
        if t < 128:  # producer warpgroup
            cuda.nanosleep(5000)  # without the barrier the consumers would read stale data
            buf[t] = 1000 * r + t
            nh.named_barrier_arrive(1, 256)  # "full"
            nh.named_barrier_sync(2, 256)  # wait for "empty" before the next round's writes
        else:  # consumer warpgroup
            nh.named_barrier_sync(1, 256)
            j = t - 128
            out[r, j] = buf[(j + 37) % 128]
            nh.named_barrier_arrive(2, 256)


def test_named_barriers_order_two_warpgroups():
    rounds = 8
    out = cuda.to_device(np.full((rounds, 128), -1, np.int32))
    _named_barrier_kernel[1, 256](out, rounds)
    j = np.arange(128)
    want = 1000 * np.arange(rounds)[:, None] + (j[None, :] + 37) % 128
    np.testing.assert_array_equal(out.copy_to_host(), want)


@cuda.jit(launch_bounds=(384, 1))
def _warp_specialized_kernel(img, a_stride, b_off, out):
    # WG0 produces (fills shared memory, signals an mbarrier) with 40 registers; WG1 and WG2
    # consume (one 64-row wgmma each) with 232.
    bars = cuda.shared.array(1, np.uint64)
    full = nh.shared_address(bars)
    t = cuda.threadIdx.x
    wg = t // 128
    if t == 0:
        nh.mbarrier_init(full, 128)
    cuda.syncthreads()
    if wg == 0:
        nh.setmaxnreg_dec(40)
        base = nh.dynamic_shared_base()
        for i in range(t, img.size, 128):
            nh.st_shared_u32(base + 4 * i, img[i])
        nh.fence_proxy_async()
        nh.mbarrier_arrive(full)
    else:
        nh.setmaxnreg_inc(232)
        base = nh.dynamic_shared_base()
        nh.mbarrier_wait_parity(full, 0)
        acc = nh.wgmma_accumulator(64, "f32")
        nh.wgmma_fence()
        for s in range(4):
            da = nh.matrix_descriptor(base + (wg - 1) * a_stride + 32 * s, 16, 1024, 128, 0)
            db = nh.matrix_descriptor(base + b_off + 32 * s, 16, 1024, 128, 0)
            acc = nh.wgmma_mma_async(acc, da, db, s, "bf16", "bf16", 1, 1, 0, 0)
        nh.wgmma_commit_group()
        nh.wgmma_wait_group(0)
        for r in range(32):
            out[wg - 1, t % 128, r] = acc[r]


def test_setmaxnreg_producer_consumer_kernel_runs_and_keeps_usetmaxreg():
    sig = "void(uint32[::1], int64, int64, float32[:, :, ::1])"
    report = inspect_kernel(_warp_specialized_kernel, sig)
    assert report.count("USETMAXREG") >= 2 and not report.setmaxnreg_ignored, report.summary()
    rng = np.random.default_rng()
    a_bits, a_val = random_operand(rng, "bf16", (128, 64))
    b_bits, b_val = random_operand(rng, "bf16", (64, 64))
    imgs = [operand_image(a_bits[:64], "K", 128), operand_image(a_bits[64:], "K", 128),
            operand_image(b_bits, "K", 128)]
    image = np.concatenate([i.data for i in imgs]).view(np.uint32)
    stride = imgs[0].data.size
    out = cuda.to_device(np.full((2, 128, 32), np.nan, np.float32))
    _warp_specialized_kernel[1, 384, 0, image.nbytes](cuda.to_device(image), stride, 2 * stride, out)
    got = out.copy_to_host()
    for c in range(2):
        _check_d(got[c], 64, "f32", a_val[64 * c:64 * (c + 1)] @ b_val.T)
