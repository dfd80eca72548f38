"""The numpy references of the GPU tests, checked on the CPU (tests/_ref.py)."""

import numpy as np
import pytest

from _ref import (
    a_fragment,
    accumulator_coords,
    bf16_bits_to_f64,
    f32_to_bf16_bits,
    fp8_to_f64,
    ldmatrix_expected,
    operand_image,
    random_operand,
    swizzle,
    unpack_accumulator,
)


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.0, 1 + 2**-7 + 2**-9], np.float32)
    assert f32_to_bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x3F81]
    assert bf16_bits_to_f64(np.array([0x3F80, 0xC040], np.uint16)).tolist() == [1.0, -3.0]


def test_fp8_decoding():
    assert fp8_to_f64([0x38, 0x7E, 0xB8, 0x01], "e4m3").tolist() == [1.0, 448.0, -1.0, 2.0**-9]
    assert fp8_to_f64([0x3C, 0x7B, 0x01], "e5m2").tolist() == [1.0, 57344.0, 2.0**-16]


@pytest.mark.parametrize("kind", ["bf16", "f16", "tf32", "e4m3", "e5m2", "s8", "u8"])
def test_random_operands_are_exact_in_their_format(kind):
    bits, vals = random_operand(np.random.default_rng(), kind, (64, 16))
    assert np.all(np.isfinite(vals)) and np.abs(vals).max() > 0
    if kind in ("e4m3", "e5m2"):
        assert np.abs(vals).min() >= 2.0**-3 and np.abs(vals).max() < 2.0**3


def test_swizzle_permutes_16_byte_chunks_within_each_period():
    for s in (32, 64, 128):
        period = 8 * s
        offs = np.arange(0, 4 * period, 16)
        sw = swizzle(offs, s)
        assert sorted(sw.tolist()) == offs.tolist()
        assert np.all(sw // period == offs // period)
    assert swizzle(128 + 0, 128) == 128 + 16  # row 1, chunk 0 -> chunk 1
    assert swizzle(7 * 128 + 16 * 2, 128) == 7 * 128 + 16 * 5
    assert swizzle(4 * 32, 32) == 4 * 32 + 16  # 32B: rows 4-7 swap their two chunks
    assert swizzle(3 * 32, 32) == 3 * 32


def test_unswizzled_k_major_image_matches_the_checked_layout():
    # hopper-facts: 64 x 16 f16 K-major, LBO = 128 (next core matrix along K), SBO = 256.
    bits = np.arange(64 * 16, dtype=np.uint16).reshape(64, 16)
    img = operand_image(bits, "K", 0)
    assert (img.lbo, img.sbo, img.ksteps) == (128, 256, 1)
    words = img.data.view(np.uint16)
    assert words[0:8].tolist() == list(range(8))  # row 0, k 0..7
    assert words[8:16].tolist() == list(range(16, 24))  # row 1
    assert words[64:72].tolist() == list(range(8, 16))  # row 0, k 8..15 at LBO
    assert words[128:136].tolist() == bits[8, :8].tolist()  # row 8 at SBO


@pytest.mark.parametrize("major, swz, shape", [
    ("K", 0, (64, 32)), ("K", 32, (64, 16)), ("K", 64, (64, 32)), ("K", 128, (256, 64)),
    ("MN", 0, (64, 32)), ("MN", 32, (64, 32)), ("MN", 64, (128, 32)), ("MN", 128, (256, 32)),
])
def test_images_hold_every_element_once(major, swz, shape):
    bits = np.random.default_rng().permutation(shape[0] * shape[1]).astype(np.uint16).reshape(shape)
    img = operand_image(bits, major, swz)
    vals = img.data.view(np.uint16)
    assert sorted(vals[vals != 0].tolist() + [0] * int((bits == 0).sum())) == sorted(bits.ravel().tolist())
    assert img.data.size % 1024 == 0


def test_accumulator_coords_tile_the_matrix_once():
    for n in (8, 64, 256):
        row, col = accumulator_coords(n)
        assert len(set(zip(row.ravel().tolist(), col.ravel().tolist()))) == 64 * n
        assert row.max() == 63 and col.max() == n - 1
    assert accumulator_coords(8)[0][0].tolist() == [0, 0, 8, 8]  # thread 0: rows 0, 0, 8, 8
    assert accumulator_coords(8)[1][5].tolist() == [2, 3, 2, 3]  # thread 5: lane%4 = 1


def test_unpack_f16_accumulator_uses_low_half_first():
    out = np.zeros((128, 2), np.uint32)
    out[0, 0] = np.array([1.0, 2.0], np.float16).view(np.uint32)[0]
    d = unpack_accumulator(out, 8, "f16")
    assert d[0, 0] == 1.0 and d[0, 1] == 2.0


def test_a_fragment_of_16_bit_a():
    bits = np.arange(64 * 16, dtype=np.uint16).reshape(64, 16)
    frag = a_fragment(bits)
    lo, hi = frag & 0xFFFF, frag >> 16
    # lane 5 of warp 1: row 16 + 1, cols 2, 3 (reg 0); row + 8 (reg 1); cols + 8 (reg 2)
    assert (lo[37, 0], hi[37, 0]) == (bits[17, 2], bits[17, 3])
    assert (lo[37, 1], lo[37, 2], lo[37, 3]) == (bits[25, 2], bits[17, 10], bits[25, 10])


def test_ldmatrix_expected():
    tile = np.arange(256, dtype=np.uint16).reshape(32, 8).astype(np.int64)
    plain = ldmatrix_expected(tile, 4, False)
    assert plain[5, 0] == tile[1, 2] | (tile[1, 3] << 16)
    assert plain[5, 3] == tile[25, 2] | (tile[25, 3] << 16)
    trans = ldmatrix_expected(tile, 2, True)
    assert trans[5, 1] == tile[8 + 2, 1] | (tile[8 + 3, 1] << 16)
