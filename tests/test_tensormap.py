"""TensorMap: every cuTensorMapEncodeTiled constraint checked in Python; the descriptor cache."""

import pytest

from numba_hopper.runtime import tensormap as tm
from numba_hopper.runtime.tensormap import TensorMap, validate_tiled

from _fakes import FakeCAI

BASE = 0x7F0000000000  # 1024-aligned


def ok(**kw):
    """A valid 2D bf16 map, with ``kw`` changed."""
    args = dict(dtype="bf16", address=BASE, shape=(256, 512), strides=(512, 1), box=(64, 64), swizzle=128)
    args.update(kw)
    return validate_tiled(**args)


def test_valid_map_is_converted_to_innermost_first():
    p = ok(shape=(3, 256, 520), strides=(256 * 520, 520, 1), box=(1, 32, 64))
    assert p.rank == 3
    assert p.global_dim == (520, 256, 3)
    assert p.global_strides == (1040, 256 * 520 * 2)  # bytes, dims 1..rank-1
    assert p.box_dim == (64, 32, 1)
    assert p.element_strides == (1, 1, 1)
    assert p.box_bytes == 64 * 32 * 2


def test_rank_one_has_no_global_strides():
    p = validate_tiled(dtype="f32", address=BASE, shape=(1000,), strides=(1,), box=(64,))
    assert p.global_strides == () and p.box_bytes == 256


def test_box_bytes_with_element_strides():
    # dimension 0's element stride is ignored by TMA (non-interleaved)
    p = ok(box=(64, 64), element_strides=(2, 1), swizzle=0)
    assert p.box_bytes == 32 * 64 * 2
    p = ok(box=(63, 64), element_strides=(4, 1), swizzle=0)
    assert p.box_bytes == 16 * 64 * 2


@pytest.mark.parametrize(
    "kw, message",
    [
        # one case per constraint, each naming the constraint and the offending value
        (dict(shape=(1,) * 6, strides=(8,) * 5 + (1,), box=(1,) * 6), r"rank must be 1..5.*rank 6"),
        (dict(shape=(), strides=(), box=()), r"rank must be 1..5.*rank 0"),
        (dict(dtype="c64"), r"dtype must be a TMA element type.*'c64'"),
        (dict(address=BASE + 8), r"global address must be 16-byte aligned.*0x7f0000000008"),
        (
            dict(shape=(4, 8, 64), strides=(512, 64, 1), box=(1, 1, 16), swizzle=32, interleave="32B", address=BASE + 16),
            r"global address must be 32-byte aligned",
        ),
        (dict(shape=(256, 0), strides=(8, 1)), r"every dimension must be 1..2\^32.*shape\[1\] = 0"),
        (dict(shape=(2**32 + 1, 8), strides=(8, 1), box=(1, 8), swizzle=0), r"1..2\^32.*shape\[0\] = 4294967297"),
        (dict(strides=(512, 2)), r"innermost dimension must be contiguous.*\(512, 2\)"),
        (dict(shape=(256, 500), strides=(500, 1)), r"multiples of 16 bytes.*strides\[0\] = 500 elements = 1000 bytes"),
        (dict(strides=(-512, 1)), r"positive multiples of 16 bytes.*-1024 bytes"),
        (
            dict(shape=(4, 8, 64), strides=(512 + 8, 64 + 8, 1), box=(1, 1, 16), swizzle=32, interleave="32B"),
            r"multiples of 32 bytes.*strides\[0\] = 520 elements = 1040 bytes",
        ),
        (dict(shape=(2, 8), strides=(2**39, 1), box=(1, 8), swizzle=0), r"< 2\^40 bytes.*1099511627776"),
        (dict(box=(257, 64)), r"box dimensions must be 1..256.*box\[0\] = 257"),
        (dict(box=(64, 0)), r"box dimensions must be 1..256.*box\[1\] = 0"),
        (dict(box=(64,)), r"box must have one entry per dimension"),
        (dict(box=(64, 12), swizzle=0), r"multiple of 16 bytes.*box\[-1\] = 12 x 2 B = 24 bytes"),
        (dict(box=(64, 128), swizzle=128), r"swizzle 128.*<= 128 bytes.*256 bytes"),
        (dict(box=(64, 64), swizzle=64), r"swizzle 64.*<= 64 bytes.*128 bytes"),
        (dict(box=(64, 32), swizzle=32), r"swizzle 32.*<= 32 bytes.*64 bytes"),
        (dict(swizzle=16), r"swizzle must be 0 \(none\), 32, 64 or 128.*16"),
        (dict(element_strides=(9, 1)), r"element strides must be 1..8.*element_strides\[0\] = 9"),
        (dict(element_strides=(0, 1)), r"element strides must be 1..8.*element_strides\[0\] = 0"),
        (dict(element_strides=(1,)), r"element_strides must have one entry per dimension"),
        (dict(interleave="16B"), r"interleaved tensor map needs rank >= 3.*rank 2"),
        (dict(interleave="8B"), r"interleave must be one of.*'8B'"),
        (
            dict(shape=(4, 8, 64), strides=(512, 64, 1), box=(1, 1, 16), swizzle=64, interleave="32B"),
            r"interleave '32B' requires swizzle 32.*64",
        ),
        (dict(l2_promotion=32), r"l2_promotion must be 0 \(none\), 64, 128 or 256.*32"),
        (dict(oob_fill="inf"), r"oob_fill must be 'zero' or 'nan'.*'inf'"),
        (dict(dtype="e4m3", box=(64, 128), oob_fill="nan"), r"oob_fill='nan' needs a floating-point dtype.*e4m3"),
        (dict(strides=(512,)), r"strides must have one entry per dimension"),
    ],
)
def test_each_constraint_is_rejected_with_its_message(kw, message):
    with pytest.raises(ValueError, match="TMA constraint violated: " + ".*" + message):
        ok(**kw)


@pytest.mark.parametrize("swizzle, inner", [(0, 8), (32, 16), (64, 32), (128, 64), (128, 8)])
def test_inner_box_within_the_swizzle_span_is_accepted(swizzle, inner):
    assert ok(box=(8, inner), swizzle=swizzle).swizzle == swizzle


def test_interleaved_rank3_is_accepted():
    p = ok(shape=(4, 8, 64), strides=(512, 64, 1), box=(1, 1, 16), swizzle=32, interleave="32B")
    assert p.interleave == "32B"


# --- the cache, with the driver replaced -------------------------------------------------


@pytest.fixture
def fake_driver(monkeypatch):
    calls = {"encode": [], "upload": []}

    def encode(params):
        calls["encode"].append(params)
        return bytes([len(calls["encode"])]) * 128

    def upload(descriptor, device):
        calls["upload"].append((descriptor, device))
        owner = object()
        return owner, 0x500000000000 + 256 * len(calls["upload"])

    monkeypatch.setattr(tm, "_encode", encode)
    monkeypatch.setattr(tm, "_upload", upload)
    tm.clear_cache()
    yield calls
    tm.clear_cache()


def test_same_arguments_return_the_same_object_without_reencoding(fake_driver):
    a = FakeCAI((256, 512), "<u2", ptr=BASE)
    t1 = TensorMap(a, (64, 64), swizzle=128, dtype="bf16")
    t2 = TensorMap(a, (64, 64), swizzle=128, dtype="bf16")
    assert t1 is t2
    assert len(fake_driver["encode"]) == 1 and len(fake_driver["upload"]) == 1
    # another array object with the same memory and layout shares the descriptor
    assert TensorMap(FakeCAI((256, 512), "<u2", ptr=BASE), (64, 64), swizzle=128, dtype="bf16") is t1
    assert tm.cache_info()["hits"] == 2 and tm.cache_info()["misses"] == 1


def test_attributes(fake_driver):
    t = TensorMap(FakeCAI((256, 512), "<u2", ptr=BASE), (64, 64), swizzle=128, dtype="bf16")
    assert t.device_ptr == 0x500000000100 and int(t) == t.device_ptr
    assert t.box_bytes == 64 * 64 * 2
    assert t.box == (64, 64) and t.shape == (256, 512)
    assert t.dtype == "bf16" and t.swizzle == 128 and t.rank == 2
    assert t.descriptor == b"\x01" * 128
    assert fake_driver["encode"][0].box_dim == (64, 64)
    assert "TensorMap(shape=(256, 512)" in repr(t)


@pytest.mark.parametrize(
    "change",
    [
        dict(box=(32, 64)),
        dict(swizzle=64, box=(64, 32)),
        dict(oob_fill="nan"),
        dict(l2_promotion=128),
        dict(dtype="f16"),
        dict(ptr=BASE + 1024),
        dict(shape=(255, 512)),
        dict(element_strides=(2, 1)),
    ],
)
def test_every_encode_parameter_is_part_of_the_key(fake_driver, change):
    def make(ptr=BASE, shape=(256, 512), box=(64, 64), dtype="bf16", **kw):
        return TensorMap(FakeCAI(shape, "<u2", ptr=ptr), box, dtype=dtype, **{"swizzle": 128, **kw})

    base = make()
    other = make(**change)
    assert other is not base
    assert len(fake_driver["encode"]) == 2


def test_invalid_maps_never_reach_the_driver(fake_driver):
    with pytest.raises(ValueError, match="16-byte aligned"):
        TensorMap(FakeCAI((256, 512), "<u2", ptr=BASE + 2), (64, 64), dtype="bf16")
    assert fake_driver["encode"] == []


def test_cache_is_lru_bounded(fake_driver, monkeypatch):
    monkeypatch.setattr(tm, "CACHE_SIZE", 2)
    arrays = [FakeCAI((64, 64), "<f4", ptr=BASE + 1024 * i) for i in range(3)]
    t0 = TensorMap(arrays[0], (8, 8))
    TensorMap(arrays[1], (8, 8))
    assert TensorMap(arrays[0], (8, 8)) is t0  # refreshes arrays[0]
    TensorMap(arrays[2], (8, 8))  # evicts arrays[1]
    assert tm.cache_info()["size"] == 2
    assert TensorMap(arrays[0], (8, 8)) is t0
    n = len(fake_driver["encode"])
    TensorMap(arrays[1], (8, 8))
    assert len(fake_driver["encode"]) == n + 1


def test_misaligned_upload_is_caught(fake_driver, monkeypatch):
    monkeypatch.setattr(tm, "_upload", lambda d, dev: (None, 0x500000000020))
    with pytest.raises(RuntimeError, match="64-byte aligned"):
        TensorMap(FakeCAI((64, 64), "<f4", ptr=BASE), (8, 8))
