"""Pure-numpy references for the GPU tests: number formats, shared-memory images, fragments.

Nothing here needs a GPU (tests/test_ref.py checks it on the CPU). Conventions:

- a 16-bit, fp8 or tf32 operand is carried as its raw bits (uint16 / uint8 / uint32) plus
  the float64 values those bits mean;
- a wgmma operand tile is ``(MN, K)`` (A: M x K; B: N x K, i.e. B transposed) and
  ``D = A @ B.T``;
- shared-memory images are bytes laid out as the wgmma canonical layouts (CUTLASS
  ``make_gmma_desc`` comments; PTX ISA "Shared Memory Matrix Layout"), relative to a
  1024-byte aligned base, with the descriptor fields that describe them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --- number formats ---------------------------------------------------------------------


def f32_to_bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_bits_to_f64(b):
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f16_bits_to_f64(b):
    return np.asarray(b, np.uint16).view(np.float16).astype(np.float64)


def tf32_bits(x):
    """float32 -> bits of a tf32-exact float32 (low 13 mantissa bits cleared)."""
    return np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)


def fp8_to_f64(codes, kind):
    """Decode e4m3 / e5m2 codes (finite ones) to float64."""
    c = np.asarray(codes, np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if kind == "e4m3":
        e, m, mbits, bias = (c >> 3) & 0xF, c & 0x7, 3, 7
    elif kind == "e5m2":
        e, m, mbits, bias = (c >> 2) & 0x1F, c & 0x3, 2, 15
    else:
        raise ValueError(kind)
    frac = m / float(1 << mbits)
    mag = np.where(e == 0, frac * 2.0 ** (1 - bias), (1.0 + frac) * 2.0 ** (e - bias))
    return sign * mag


def random_operand(rng, kind, shape):
    """Random (bits, float64 values) of one wgmma input type; moderate magnitudes."""
    if kind in ("bf16", "f16", "tf32"):
        x = rng.standard_normal(shape).astype(np.float32)
        if kind == "bf16":
            bits = f32_to_bf16_bits(x)
            return bits, bf16_bits_to_f64(bits)
        if kind == "f16":
            bits = x.astype(np.float16).view(np.uint16)
            return bits, f16_bits_to_f64(bits)
        bits = tf32_bits(x)
        return bits, bits.view(np.float32).astype(np.float64)
    if kind in ("e4m3", "e5m2"):
        lo, hi, shift = (4, 9, 3) if kind == "e4m3" else (12, 17, 2)  # |x| in [2^-3, 2^3)
        e = rng.integers(lo, hi, shape)
        m = rng.integers(0, 1 << shift, shape)
        s = rng.integers(0, 2, shape)
        codes = ((s << 7) | (e << shift) | m).astype(np.uint8)
        return codes, fp8_to_f64(codes, kind)
    if kind == "s8":
        v = rng.integers(-128, 128, shape).astype(np.int8)
        return v.view(np.uint8), v.astype(np.float64)
    if kind == "u8":
        v = rng.integers(0, 256, shape).astype(np.uint8)
        return v, v.astype(np.float64)
    raise ValueError(kind)


ELEM_BYTES = {"bf16": 2, "f16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "s8": 1, "u8": 1}


def rel_frobenius(got, ref):
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


# --- shared-memory images of wgmma operands -----------------------------------------------


def swizzle(offset, swizzle_bytes):
    """Swizzle<B,4,3>: bits [4, 4+B) ^= bits [7, 7+B), B = log2(swizzle_bytes / 16)."""
    if swizzle_bytes == 0:
        return offset
    mask = swizzle_bytes // 16 - 1
    return offset ^ (((offset >> 7) & mask) << 4)


@dataclass
class SmemImage:
    data: np.ndarray  # uint8 bytes, relative to a 1024-aligned base
    lbo: int
    sbo: int
    swizzle_bytes: int
    step_bytes: int  # start-address advance from one wgmma K-step to the next
    ksteps: int


def operand_image(bits, major, swizzle_bytes):
    """Lay the ``(MN, K)`` element bits out for a descriptor (``major`` "K" or "MN").

    K-major: a swizzled tile is one swizzle atom wide along K (``swizzle_bytes`` of K per
    row); an unswizzled one any multiple of 32 bytes, core matrices adjacent along K
    (LBO = 128). MN-major (16-bit types only): K a multiple of 16; swizzled: 8-row K groups
    adjacent (SBO = 8 * swizzle_bytes), then the next swizzle atom along MN (LBO);
    unswizzled: 8-row K groups adjacent (LBO = 128), then the next 16 bytes of MN (SBO).
    One wgmma K-step is 32 bytes of K (K-major) or 16 K-rows (MN-major).
    """
    bits = np.ascontiguousarray(bits)
    mn, k = bits.shape
    e = bits.dtype.itemsize
    by = bits.view(np.uint8).reshape(mn, k * e)  # row mn, byte kb (little-endian elements)
    if major == "K":
        row_bytes = k * e
        if swizzle_bytes:
            assert row_bytes == swizzle_bytes, (row_bytes, swizzle_bytes)
            lbo, sbo, step = 16, 8 * swizzle_bytes, 32
        else:
            assert row_bytes % 32 == 0
            lbo, sbo, step = 128, 128 * (row_bytes // 16), 256
        r = np.arange(mn)[:, None]
        b = np.arange(row_bytes)[None, :]
        if swizzle_bytes:
            logical = (r // 8) * sbo + (r % 8) * swizzle_bytes + b
        else:
            logical = (r // 8) * sbo + (b // 16) * lbo + (r % 8) * 16 + b % 16
        src = by
        nsteps = row_bytes // 32
    elif major == "MN":
        assert e == 2, "transposed (MN-major) operands exist for 16-bit types only"
        mn_bytes = mn * e
        kk = np.arange(k)[:, None]
        b = np.arange(mn_bytes)[None, :]
        src = np.ascontiguousarray(bits.T).view(np.uint8).reshape(k, mn_bytes)  # row k, byte mb
        if swizzle_bytes:
            assert mn_bytes % swizzle_bytes == 0
            sbo = 8 * swizzle_bytes  # next 8-row K group
            lbo = sbo * (k // 8)  # next swizzle atom along MN
            logical = (b // swizzle_bytes) * lbo + (kk // 8) * sbo + (kk % 8) * swizzle_bytes + b % swizzle_bytes
            step = 2 * sbo
        else:
            lbo = 128  # next 8-row K group
            sbo = 128 * (k // 8)  # next 16-byte column of core matrices along MN
            logical = (b // 16) * sbo + (kk // 8) * lbo + (kk % 8) * 16 + b % 16
            step = 2 * lbo
        nsteps = k // 16
    else:
        raise ValueError(major)
    phys = swizzle(logical, swizzle_bytes)
    size = int(phys.max()) + 1
    size = -(-size // 1024) * 1024
    data = np.zeros(size, np.uint8)
    assert len(np.unique(phys)) == phys.size, "layout is not one-to-one"
    data[phys.ravel()] = src.ravel()
    return SmemImage(data, lbo, sbo, swizzle_bytes, step, nsteps)


# --- register fragments ---------------------------------------------------------------------


def accumulator_coords(n):
    """(row, col) of register r of thread t of an m64nN f32/s32 accumulator: arrays (128, n/2)."""
    t = np.arange(128)[:, None]
    r = np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((r >> 1) & 1)
    col = 8 * (r >> 2) + 2 * (lane % 4) + (r & 1)
    return row, col


def unpack_accumulator(out, n, kind):
    """The 64 x n matrix from a (128, registers) accumulator dump; NaN where nothing landed."""
    if kind == "f16":
        vals = np.ascontiguousarray(out).view(np.float16).reshape(128, n // 2).astype(np.float64)
    else:
        vals = np.asarray(out).reshape(128, n // 2).astype(np.float64)
    row, col = accumulator_coords(n)
    d = np.full((64, n), np.nan)
    d[row, col] = vals
    return d


def a_fragment(bits):
    """RS-mode A registers (128, 4) uint32 of a 64 x (32 bytes) A tile.

    Register j of lane l of warp w holds bytes [b, b + 4) of row 16w + l//4 + 8(j % 2),
    b = 4(l % 4) + 16(j // 2) (the mma.m16n8kX A fragment, one 16-row slice per warp).
    """
    by = np.ascontiguousarray(bits).view(np.uint8).reshape(64, 32)
    frag = np.zeros((128, 4), np.uint32)
    for t in range(128):
        w, lane = divmod(t, 32)
        for j in range(4):
            row = 16 * w + lane // 4 + 8 * (j % 2)
            b = 4 * (lane % 4) + 16 * (j // 2)
            frag[t, j] = by[row, b:b + 4].view(np.uint32)[0]
    return frag


def ldmatrix_expected(tile, num, trans):
    """Registers (32, num) uint32 that ldmatrix.x{num} gives when lane l points at row l of
    ``tile`` (a (32, 8) uint16 array: matrix i = rows 8i..8i+7)."""
    out = np.zeros((32, num), np.uint32)
    for lane in range(32):
        for i in range(num):
            m = tile[8 * i:8 * i + 8].astype(np.uint32)
            if trans:
                m = m.T
            r, c = lane // 4, 2 * (lane % 4)
            out[lane, i] = m[r, c] | (m[r, c + 1] << 16)
    return out
