"""The kit's host side and its formulas, against the references in tests/_ref.py (CPU).

Layouts and fragments are checked index by index against the independent numpy models of
``_ref`` (which the GPU tests of the intrinsics validated on the hardware); the factories'
argument checks must name the rule they enforce.
"""

import importlib
import inspect

import numpy as np
import pytest

from _ref import accumulator_coords as ref_accumulator_coords
from _ref import operand_image, swizzle as ref_swizzle
from numba_hopper import kit
from numba_hopper.kit import fragments, layouts
from numba_hopper.kit.barriers import NamedBarriers, make_ordered_barrier
from numba_hopper.kit.epilogue import OUT_DTYPES as OUT_BYTES, make_tile_store
from numba_hopper.kit.layouts import SmemPlan, make_mma, operand_layout, swizzle_host
from numba_hopper.kit.pipeline import make_ring
from numba_hopper.kit.scheduler import grouped_tile_host, make_tile_scheduler
from numba_hopper.kit.warpspec import register_budget, warp_specialization
from numba_hopper.runtime.arrays import DeviceView

KIT_MODULES = ["barriers", "epilogue", "fragments", "host", "layouts", "overlap", "pipeline", "scheduler", "warpspec"]


@pytest.mark.parametrize("name", KIT_MODULES)
def test_every_kit_module_and_public_name_is_documented(name):
    mod = importlib.import_module(f"numba_hopper.kit.{name}")
    assert len((mod.__doc__ or "").strip()) > 200, f"{name}: the module docstring must teach the part"
    missing = [n for n in mod.__all__ if callable(getattr(mod, n))
               and not ((getattr(mod, n).__dict__.get("__doc__") if inspect.isclass(getattr(mod, n))
                         else getattr(mod, n).__doc__) or "").strip()]
    assert not missing, f"numba_hopper.kit.{name}: no docstring on {missing}"
    everything = {n for m in KIT_MODULES for n in importlib.import_module(f"numba_hopper.kit.{m}").__all__}
    assert set(kit.__all__) <= everything


# --- fragments ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 64, 136, 256])
def test_accumulator_coords_match_the_reference(n):
    rows, cols = fragments.accumulator_coords(n)
    ref_rows, ref_cols = ref_accumulator_coords(n)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(cols, ref_cols)
    seen = np.zeros((64, n), int)
    np.add.at(seen, (rows, cols), 1)
    assert (seen == 1).all()  # every element in exactly one register


def test_f16_accumulator_coords_pack_register_pairs():
    rows, cols = fragments.accumulator_coords(64, "f16")
    f32_rows, f32_cols = fragments.accumulator_coords(64)
    np.testing.assert_array_equal(rows, f32_rows[:, 0::2])
    np.testing.assert_array_equal(cols, f32_cols[:, 0::2])


@pytest.mark.parametrize("n", [16, 64, 256])
def test_accumulator_pairs_are_the_rs_a_operand(n):
    """Accumulator registers 8kk + 2m, 8kk + 2m + 1 hold A register m of k16 slice kk."""
    rows, cols = fragments.accumulator_coords(n)
    a_rows, a_cols = fragments.a_operand_coords("bf16")
    for kk in range(n // 16):
        for m in range(4):
            for e in range(2):
                np.testing.assert_array_equal(rows[:, 8 * kk + 2 * m + e], a_rows[:, m, e])
                np.testing.assert_array_equal(cols[:, 8 * kk + 2 * m + e], 16 * kk + a_cols[:, m, e])


def test_a_operand_coords_match_the_reference_fragment():
    """_ref.a_fragment: register j of lane l holds bytes 4(l%4) + 16(j//2) .. of row 16w + l//4 + 8(j%2)."""
    t = np.arange(128)
    for dtype, e_bytes in (("bf16", 2), ("e4m3", 1)):
        rows, cols = fragments.a_operand_coords(dtype)
        for j in range(4):
            byte = 4 * (t % 32 % 4) + 16 * (j // 2)
            np.testing.assert_array_equal(rows[:, j, 0], 16 * (t // 32) + t % 32 // 4 + 8 * (j % 2))
            np.testing.assert_array_equal(cols[:, j, 0] * e_bytes, byte)


def test_fp8_a_operand_exchange_gives_each_lane_its_columns():
    """A host model of make_a_operand_fp8's shuffles (the device code's index arithmetic, lane
    by lane): every byte of every A register is the fp8 of the accumulator element the k32
    A fragment puts there."""
    n = 64
    rows, cols = fragments.accumulator_coords(n)
    value = np.zeros((64, n), int)
    value[rows, cols] = np.arange(128 * (n // 2)).reshape(128, n // 2) % 251  # a tag per element
    frag = value[rows, cols]  # (thread, register)
    a_rows, a_cols = fragments.a_operand_coords("e4m3")
    for kk in range(n // 32):
        for m in range(4):
            j, h = m % 2, m // 2
            base = 16 * kk + 8 * h + 2 * j
            words = [frag[:, base], frag[:, base + 1], frag[:, base + 4], frag[:, base + 5]]  # bytes 0-3
            for t in range(128):
                lane, q = t % 32, t % 4
                src = t - q + 2 * (q % 2)
                half = 0 if q < 2 else 2  # selector 0x5410 (bytes 0, 1) or 0x7632 (bytes 2, 3)
                got = [words[half][src], words[half + 1][src], words[half][src + 1], words[half + 1][src + 1]]
                want = value[a_rows[t, m], 32 * kk + a_cols[t, m]]
                assert got == list(want), (kk, m, t, lane)


def test_make_a_operand_fp8_checks_its_dtype():
    with pytest.raises(ValueError, match="e4m3"):
        fragments.make_a_operand_fp8("bf16")


def test_make_a_loader_needs_a_k_major_16_bit_tile():
    with pytest.raises(ValueError, match="ldmatrix_x4_trans"):
        fragments.make_a_loader(operand_layout("MN", 128, "bf16", mn=64, k=64))
    with pytest.raises(ValueError, match="K-major 16-bit"):
        fragments.make_a_loader(operand_layout("K", 128, "e4m3", mn=64, k=128))


# --- layouts -----------------------------------------------------------------------------------


def _tma_image(bits, layout):
    """The bytes TMA leaves in shared memory for ``layout``'s boxes: box i at i * box_bytes,
    each row-major with ``swizzle``-byte rows, swizzled."""
    e = layout.element_bytes
    if layout.major == "K":
        by = np.ascontiguousarray(bits).view(np.uint8).reshape(layout.mn, layout.k * e)
    else:
        by = np.ascontiguousarray(bits.T).view(np.uint8).reshape(layout.k, layout.mn * e)
    rows, row_bytes = by.shape
    data = np.zeros(layout.tile_bytes, np.uint8)
    r = np.arange(rows)[:, None]
    b = np.arange(row_bytes)[None, :]
    box, within = b // layout.swizzle, b % layout.swizzle
    data[box * layout.box_bytes + swizzle_host(r * layout.swizzle + within, layout.swizzle)] = by
    return data


@pytest.mark.parametrize("major, swz, dtype, mn, k", [
    ("K", 128, "bf16", 64, 64), ("K", 64, "bf16", 128, 32), ("K", 32, "f16", 64, 16), ("K", 128, "e4m3", 64, 128),
    ("MN", 128, "bf16", 256, 64), ("MN", 64, "bf16", 64, 32), ("MN", 32, "f16", 64, 16), ("MN", 128, "f16", 64, 16),
])
def test_operand_layout_matches_the_canonical_image(major, swz, dtype, mn, k):
    """The TMA boxes of a layout are exactly wgmma's canonical layout (_ref.operand_image) with
    the layout's LBO, SBO and k-step."""
    layout = operand_layout(major, swz, dtype, mn=mn, k=k)
    bits = np.random.default_rng(0).integers(0, 255, (mn, k * layout.element_bytes), np.uint8).view(
        {1: np.uint8, 2: np.uint16}[layout.element_bytes])
    ref = operand_image(bits, major, swz)
    np.testing.assert_array_equal(_tma_image(bits, layout), ref.data[:layout.tile_bytes])
    assert layout.sbo == ref.sbo and layout.k_steps == ref.ksteps
    if layout.k_steps > 1:
        assert layout.k_offset(1) == ref.step_bytes
    if major == "MN":
        assert layout.lbo == ref.lbo


def test_k_major_k_steps_cross_boxes():
    A = operand_layout("K", 64, "bf16", mn=64, k=64)  # two 64-byte boxes along K
    assert A.boxes == 2 and A.box == (64, 32)
    assert [A.k_offset(kk) for kk in range(4)] == [0, 32, 64 * 64, 64 * 64 + 32]


def test_gemm_tiles_have_the_gemm_numbers():
    """The production GEMM's 128 x 256 tiles (kernels/mainloop.py): A K-major, B N-major."""
    A = operand_layout("K", 128, "bf16", mn=128, k=64)
    B = operand_layout("MN", 128, "bf16", mn=256, k=64)
    assert (A.lbo, A.sbo, A.k_offset(1), A.tile_bytes, A.mn_offset(64)) == (16, 1024, 32, 16384, 8192)
    assert (B.lbo, B.sbo, B.k_offset(1), B.tile_bytes, B.boxes, B.box) == (8192, 1024, 2048, 32768, 4, (64, 64))
    assert (A.tnsp, B.tnsp) == (0, 1)


@pytest.mark.parametrize("args, message", [
    (("N", 128, "bf16", 64, 64), "major must be"),
    (("K", 0, "bf16", 64, 64), "use 32"),
    (("K", 16, "bf16", 64, 64), "swizzle must be"),
    (("MN", 128, "e4m3", 64, 128), "K-major only"),
    (("K", 128, "bf16", 60, 64), "multiple of 8"),
    (("K", 128, "bf16", 64, 48), "whole swizzle spans"),
    (("MN", 128, "bf16", 96, 64), "whole swizzle spans of MN"),
    (("K", 128, "bf16", 512, 64), "at most 256 rows"),
    (("K", 128, "int4", 64, 64), "dtype must be"),
])
def test_operand_layout_names_the_broken_rule(args, message):
    with pytest.raises(ValueError, match=message):
        operand_layout(*args)


def test_mma_checks_its_tiles():
    A = operand_layout("K", 128, "bf16", mn=64, k=64)
    with pytest.raises(ValueError, match="same K"):
        make_mma(A, operand_layout("K", 64, "bf16", mn=64, k=32))
    with pytest.raises(ValueError, match="multiple of 64"):
        make_mma(operand_layout("K", 128, "bf16", mn=32, k=64), A)
    with pytest.raises(ValueError, match=r"\[8, 256\]"):
        make_mma(A, operand_layout("MN", 128, "bf16", mn=512, k=64))
    B192 = operand_layout("MN", 128, "bf16", mn=192, k=64)  # three whole 64-column boxes
    make_mma(A, B192, n=160)  # N = 160 reads the tile's first 160 columns
    for n in (164, 200, 0):
        with pytest.raises(ValueError, match="at most the B tile"):
            make_mma(A, B192, n=n)


def test_swizzle_matches_the_reference():
    o = np.arange(4096)
    for span in (32, 64, 128):
        np.testing.assert_array_equal(swizzle_host(o, span), ref_swizzle(o, span))
    assert swizzle_host(1234, 0) == 1234


def test_smem_plan_aligns_and_refuses_overflow():
    plan = SmemPlan()
    assert plan.add("a", 100, 8) == 0
    assert plan.add("b", 16384, 1024) == 1024
    assert plan.add("bars", 64, 8) == 1024 + 16384
    assert plan.size == 1024 + 16384 + 64
    with pytest.raises(ValueError, match="already placed"):
        plan.add("a", 8)
    with pytest.raises(ValueError, match="power of two"):
        plan.add("c", 8, 24)
    with pytest.raises(ValueError, match=r"232448 bytes.*a 100 B at 0.*fewer pipeline stages"):
        plan.add("ring", 220 * 1024, 1024)


# --- pipeline, barriers, warp specialization ------------------------------------------------------


def test_ring_host_numbers_and_checks():
    ring = make_ring(4, consumer_arrivals=8, tx_bytes=49152)
    assert (ring.stages, ring.consumer_arrivals, ring.tx_bytes, ring.barrier_bytes) == (4, 8, 49152, 64)
    with pytest.raises(TypeError):
        make_ring(4, 8, 49152)  # arrival counts are keyword-only: explicit
    for bad in ({"consumer_arrivals": 0, "tx_bytes": 1}, {"consumer_arrivals": 1, "tx_bytes": 2**20}):
        with pytest.raises(ValueError, match="make_ring"):
            make_ring(2, **bad)


def test_named_barriers_allocate_from_one_and_refuse_the_sixteenth():
    ids = NamedBarriers()
    assert ids.allocate("epilogue", 2) == 1
    assert ids.allocate("turns", 2) == 3
    assert ids.ids == {"epilogue": 1, "turns": 3}
    with pytest.raises(ValueError, match="already allocated"):
        ids.allocate("turns")
    assert ids.allocate("rest", 11) == 5
    with pytest.raises(ValueError, match=r"epilogue: 1-2, turns: 3-4, rest: 5-15"):
        ids.allocate("one more")


def test_ordered_barrier_checks():
    order = make_ordered_barrier(3, members=2)
    assert (order.members, order.first) == (2, 3)
    with pytest.raises(ValueError, match=">= 2 members"):
        make_ordered_barrier(1, members=1)
    with pytest.raises(ValueError, match="not all in 1-15"):
        make_ordered_barrier(15, members=2)
    with pytest.raises(ValueError, match="multiple of 32"):
        make_ordered_barrier(1, threads=100)


@pytest.mark.parametrize("consumers, producer, expected", [
    (2, 40, (168, 40, 232)),  # the GEMM's 128 x 256 split
    (2, 24, (168, 24, 240)),
    (3, 40, (128, 40, 152)),
    (1, 40, (255, 40, 256)),
])
def test_register_budget(consumers, producer, expected):
    at_launch, p, c = register_budget(consumers, producer)
    assert (at_launch, p, c) == expected
    assert p * 128 + c * 128 * consumers <= 65536 or consumers == 1


def test_register_budget_names_the_rule():
    with pytest.raises(ValueError, match="multiple of 8"):
        register_budget(2, 44)
    with pytest.raises(ValueError, match=r"\[24, 168\]"):
        register_budget(2, 16)
    with pytest.raises(ValueError, match="1..7"):
        register_budget(8)


def test_warp_specialization_shapes():
    ws = warp_specialization(consumers=2, producer_regs=40)
    assert (ws.threads, ws.launch_bounds, ws.producer_regs, ws.consumer_regs, ws.trades) == (384, (384, 1), 40, 232,
                                                                                            True)
    one = warp_specialization(consumers=1)
    assert (one.threads, one.trades) == (256, False)
    with pytest.raises(ValueError, match="cluster_size"):
        warp_specialization(cluster_size=0)


# --- epilogue, scheduler, host ---------------------------------------------------------------------


@pytest.mark.parametrize("n, dtype, span, box", [
    (256, "bf16", 128, (64, 64)), (256, "f32", 128, (64, 32)), (96, "f16", 64, (64, 32)), (48, "bf16", 32, (64, 16)),
    (16, "f32", 64, (64, 16)),
])
def test_tile_store_sub_tiles(n, dtype, span, box):
    store = make_tile_store(n, dtype, buffers=2)
    assert (store.span, store.box, store.swizzle) == (span, box, span)
    assert store.buffer_bytes == 2 * max(1024, 64 * span)


@pytest.mark.parametrize("args, kwargs, message", [
    ((40, "bf16"), {}, "multiple of 16"), ((64, "s8"), {}, "out_dtype"), ((64, "bf16", 3), {}, "buffers"),
    ((64, "bf16"), {"cols": 24}, "cols must divide"), ((64, "e4m3"), {"cols": 16}, "cols must divide"),
    ((96, "bf16"), {"cols": 64}, "cols must divide"), ((64, "bf16"), {"epilogue": (1, 2)}, "TileEpilogue"),
])
def test_tile_store_names_the_broken_rule(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_tile_store(*args, **kwargs)


@pytest.mark.parametrize("n, dtype, cols, span", [(256, "e4m3", None, 128), (256, "e4m3", 64, 64),
                                                   (256, "bf16", 32, 64), (112, "f32", 16, 64), (128, "e5m2", 32, 32)])
def test_tile_store_sub_tiles_of_a_chosen_width(n, dtype, cols, span):
    store = make_tile_store(n, dtype, cols=cols)
    assert (store.cols, store.span, store.box, store.swizzle) == (span // OUT_BYTES[dtype], span,
                                                                 (64, span // OUT_BYTES[dtype]), span)
    assert (store.direct is None) == (OUT_BYTES[dtype] == 1)  # (an fp8 element alone has no conversion)


@pytest.mark.parametrize("span", [32, 64, 128])
def test_box_address_per_chunk_is_the_tma_swizzle(span):
    address = layouts.make_box_address(span).py_func  # (plain integer arithmetic: runs on the host)
    for row in range(64):
        for byte in range(span):
            assert address(4096, row, byte) == 4096 + swizzle_host(row * span + byte, span)
    with pytest.raises(ValueError, match="span"):
        layouts.make_box_address(16)


def test_grouped_raster_order():
    """The module docstring's example: group_m = 2, 4 x 3 tiles."""
    order = np.zeros((4, 3), int)
    for tile in range(12):
        order[grouped_tile_host(tile, 4, 3, 2)] = tile
    np.testing.assert_array_equal(order, [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]])


@pytest.mark.parametrize("tiles_m, tiles_n, group_m", [(7, 5, 3), (1, 9, 8), (16, 16, 8), (5, 1, 2)])
def test_grouped_raster_visits_every_tile_once(tiles_m, tiles_n, group_m):
    seen = {grouped_tile_host(t, tiles_m, tiles_n, group_m) for t in range(tiles_m * tiles_n)}
    assert seen == {(m, n) for m in range(tiles_m) for n in range(tiles_n)}


def test_scheduler_checks():
    with pytest.raises(ValueError, match="raster"):
        make_tile_scheduler(128, 256, raster="snake")
    with pytest.raises(ValueError, match="group_m"):
        make_tile_scheduler(128, 256, group_m=0)


def test_host_tensor_maps_are_checked_before_encoding():
    """A row pitch of 120 bytes is no multiple of 16: refused before the driver is asked."""
    from numba_hopper.kit.host import operand_tensor_map, tensor_map_arg

    view = DeviceView(ptr=0x10000, shape=(128, 60), strides=(60, 1), dtype="bf16", itemsize=2, device=0,
                      framework="cai")
    with pytest.raises(ValueError, match="16 bytes"):
        operand_tensor_map(view, operand_layout("K", 64, "bf16", mn=128, k=32))
    wide = DeviceView(ptr=0x10000, shape=(128, 256), strides=(256, 1), dtype="bf16", itemsize=2, device=0,
                      framework="cai")
    with pytest.raises(ValueError, match="swizzle 128"):
        tensor_map_arg(wide, (64, 128), swizzle=128)
    with pytest.raises(ValueError, match="item size|does not match"):
        operand_tensor_map(wide, operand_layout("K", 128, "e4m3", mn=64, k=128))


def test_multicast_parts_of_a_tile():
    A = operand_layout("K", 128, "bf16", mn=128, k=64)
    B = operand_layout("MN", 128, "bf16", mn=256, k=64)
    assert layouts.tma_box(A, 2) == (64, 64) and layouts.tma_box(B, 2) == (64, 64) and layouts.tma_box(A) == A.box
    assert layouts.make_tile_loads(A, 2).box == (64, 64)
    assert layouts.make_tile_loads(A, 2, evict="last").box == (64, 64)
    with pytest.raises(ValueError, match="evict must be one of"):
        layouts.make_tile_loads(A, evict="evict_last")
    with pytest.raises(ValueError, match="8-row atoms"):
        layouts.tma_box(operand_layout("K", 128, "bf16", mn=64, k=64), 16)
    with pytest.raises(ValueError, match="whole boxes"):
        layouts.tma_box(B, 3)
