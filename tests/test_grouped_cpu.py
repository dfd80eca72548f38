"""Grouped GEMM on a CPU: the scheduler's walk over the groups (the host build of the device
code), what the grouped kernels compile to, and grouped_gemm()'s checks (fake arrays)."""

import itertools
import random

import numpy as np
import pytest
from numba.cuda import types

import numba_hopper
import numba_hopper.matmul.plan_cache as g
from _fakes import FakeCAI
from numba_hopper import grouped_gemm
from numba_hopper.matmul.heuristics import grouped_config, max_stages
from numba_hopper.errors import DeviceMismatchError, DtypeError, LayoutError, OverlapError, ShapeError
from numba_hopper.matmul.grouped import check_group_sizes
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.epilogue import EpilogueConfig
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.kernels.scheduler import GROUP_WALK_END, GroupWork, host_group_walk
from numba_hopper.runtime.launch import DeviceLimits
from numba_hopper.tools.sass import inspect_kernel

# --- the walk ------------------------------------------------------------------------------


def _walk(mode, sizes, rows, N, block_m=128, block_n=256, ctas=132, group_m=8):
    """Every CTA's tiles, as the kernel's producer and consumers walk them: ``{cta: [GroupTile]}``."""
    first, next_, origin = host_group_walk(mode, block_m, block_n, group_m)
    tiles_n = -(-N // block_n)
    ends = list(itertools.accumulate(sizes)) if mode == "contiguous" else list(sizes)
    walks = {}
    for cta in range(ctas):
        w = GroupWork(tiles_n, GROUP_WALK_END, 7, cta, ctas, len(sizes), ends, rows)
        item, tiles, last = first(w), [], -1
        while item.tile < w.num_tiles:
            assert item.tile > last and (item.tile - cta) % ctas == 0  # cta, cta + ctas, ...
            assert (item.k_begin, item.k_end) == (0, 7)
            last = item.tile
            tiles.append(origin(w, item, 0, 0))
            item = next_(w, item)
        walks[cta] = tiles
    return walks


def _expected(mode, sizes, block_m, block_n, N):
    """``{(group, m0, n0): row_end}`` of every tile of every group."""
    tiles, start = {}, 0
    for group, n in enumerate(sizes):
        row0 = 0 if mode == "masked" else start
        for m in range(-(-n // block_m)):
            for pn in range(-(-N // block_n)):
                tiles[(group, row0 + m * block_m, pn * block_n)] = row0 + n
        start += n
    return tiles


CASES = [
    ("empty groups", [0, 300, 0, 0, 129, 0]),
    ("skewed", [100] * 7 + [1000]),
    ("G=1", [1000]),
    ("G=1 empty", [0]),
    ("all empty", [0] * 5),
    ("sizes 0 1 7 129 1000", [0, 1, 7, 129, 1000]),
    ("many groups", [random.Random(1).randrange(0, 300) for _ in range(256)]),
    ("full tiles", [128, 256, 384]),
]


@pytest.mark.parametrize("mode", ["contiguous", "masked"])
@pytest.mark.parametrize("name,sizes", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("block_m,block_n,N,ctas", [(128, 256, 512, 132), (64, 128, 1000, 7), (128, 64, 64, 1)])
def test_walk_visits_every_tile_of_every_group_once(mode, name, sizes, block_m, block_n, N, ctas):
    rows = sum(sizes) + 5 if mode == "contiguous" else max(sizes)  # contiguous: rows past the last group
    walks = _walk(mode, sizes, rows, N, block_m, block_n, ctas)
    seen = [(t.batch, t.m0, t.n0, t.row_end) for tiles in walks.values() for t in tiles]
    expected = _expected(mode, sizes, block_m, block_n, N)
    assert len(seen) == len(set(seen)) == len(expected)
    assert {(b, m0, n0): end for b, m0, n0, end in seen} == expected
    # the host's bound (the grid) covers them all: sum of ceil(rows_g / BM) <= ceil(rows / BM) + G
    tiles_m = -(-rows // block_m)
    bound = (len(sizes) * tiles_m if mode == "masked" else tiles_m + len(sizes)) * -(-N // block_n)
    assert len(seen) <= bound


def test_walk_keeps_the_raster_order_within_a_group():
    """Within a group the tiles run down ``group_m`` tile rows before moving right (L2 reuse of B[g])."""
    walks = _walk("contiguous", [3 * 128, 2 * 128], 5 * 128, 4 * 256, ctas=1, group_m=2)
    order = [(t.batch, t.m0 // 128, t.n0 // 256) for t in walks[0]]
    assert order[:6] == [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1), (0, 0, 2), (0, 1, 2)]
    assert order[12:14] == [(1, 3, 0), (1, 4, 0)]


@pytest.mark.parametrize("mode", ["contiguous", "masked"])
def test_walk_clamps_sizes_that_break_the_preconditions(mode):
    """Decreasing or too-large sizes give wrong groups, never a row outside [0, rows)."""
    sizes = [500, -300, 900, 10**6] if mode == "contiguous" else [500, 10**6, 3]
    ends = list(itertools.accumulate(sizes)) if mode == "contiguous" else sizes
    first, next_, origin = host_group_walk(mode, 128, 256)
    rows = 1000
    w = GroupWork(1, GROUP_WALK_END, 1, 0, 1, len(ends), [e & 0xFFFFFFFF for e in ends], rows)  # read as u32
    item = first(w)
    while item.tile < w.num_tiles:
        t = origin(w, item, 0, 0)
        assert 0 <= t.m0 < t.row_end <= rows
        item = next_(w, item)


@pytest.mark.parametrize("name,sizes,rows,ok", [
    ("offsets", [0, 5, 5, 9], 9, True), ("offsets", [], 0, True), ("offsets", [3, 2], 9, False),
    ("offsets", [-1, 4], 9, False), ("offsets", [4, 10], 9, False),
    ("masked_m", [0, 9, 3], 9, True), ("masked_m", [10], 9, False), ("masked_m", [-1], 9, False),
])
def test_debug_check_of_the_sizes(name, sizes, rows, ok):
    if ok:
        check_group_sizes(name, np.array(sizes, np.int32), rows)
    else:
        with pytest.raises(ValueError, match=name):
            check_group_sizes(name, np.array(sizes, np.int32), rows)


# --- the kernels ---------------------------------------------------------------------------

SILU = EpilogueConfig(row_scale=True, activation="silu")
VEC = (types.Array(types.float32, 1, "A"),)


def _grouped(mode, out_dtype="bf16", block_m=128, block_n=256, b_major="N", epilogue=None):
    stages = max_stages("bf16", out_dtype, block_n, block_m=block_m, b_major=b_major, epilogue=epilogue)
    return GemmConfig("bf16", out_dtype, "K", b_major, block_m=block_m, block_n=block_n, stages=stages,
                      epilogue=epilogue, grouped=mode)


# Each mode with each output width and sub-tile swizzle (128 B, and 64 B at block_n = 160), both B
# majors, one and two consumers, and the fused row scale + activation at the widest tile.
KERNELS = [
    _grouped("contiguous"),
    _grouped("contiguous", "bf16", epilogue=SILU),
    _grouped("masked", "f32", 64, 128, b_major="K"),
    _grouped("masked", "f16", 128, 160),
    _grouped("masked", "bf16", 64, 64, epilogue=SILU),
]


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("cfg", KERNELS, ids=lambda c: f"{c.grouped}-{c.out_dtype}-{c.b_major}-{c.block_m}x{c.block_n}"
                         f"{'-silu' if c.epilogue else ''}")
def test_grouped_sass_has_hopper_instructions_and_no_spills(cfg):
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, VEC if cfg.epilogue else None))
    assert r.count("HGMMA") >= 4 and r.count("UTMALDG") >= 2, r.summary()
    assert r.count("UTMASTG") >= 1  # full warpgroups store with TMA
    # a warpgroup that crosses its group's end: shared -> registers -> global, 16 bytes a thread
    assert r.count("LDS.128") >= 1 and r.count("STG.E.128") >= 1, r.summary()
    assert r.count("USETMAXREG") == (2 if cfg.consumers == 2 else 0) and not r.setmaxnreg_ignored
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    # a warp-uniform warpgroup index keeps two consumers' k-block loop convergent (gemm_sm90)
    assert cfg.consumers == 1 or not r.warpsync_before_wgmma


@pytest.mark.parametrize("kw,msg", [
    (dict(grouped="ragged"), "grouped must be"), (dict(grouped="masked", cluster_n=2), "without a cluster"),
    (dict(grouped="contiguous", block_n=128, stream_k=True), "without a cluster"),
    (dict(grouped="masked", epilogue=EpilogueConfig(bias="col")), "fuse only"),
    (dict(grouped="masked", in_dtype="e4m3", a_major="K", b_major="N"), "K-major"),
    (dict(grouped="contiguous", in_dtype="e4m3", a_major="K", b_major="K", block_n=256, block_scaled=True),
     "256-wide tiles run with block_m = 128, ungrouped"),
])
def test_grouped_config_rejects_what_it_cannot_run(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GemmConfig(**kw)


def _view(shape, strides=None, dtype="bf16"):
    from numba_hopper.runtime.arrays import DeviceView

    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    return DeviceView(0x7F0000000000, shape, strides, dtype, 2, 0, "torch")


LIMITS = DeviceLimits(0, (9, 0), 132)


@pytest.mark.parametrize("mode,rows,groups,tile", [
    ("contiguous", 8 * 2048, 8, 128), ("contiguous", 16 * 32, 16, 64), ("masked", 256, 16, 128), ("masked", 64, 16, 64)])
def test_grouped_tile_follows_the_rows_per_group(mode, rows, groups, tile):
    cfg = grouped_config(_view((rows, 4096)), _view((4096, 7168)), _view((rows, 7168)), mode, groups, None, False,
                         limits=LIMITS)
    assert cfg.grouped == mode and cfg.block_m == tile and cfg.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("rows,groups,N,K", [(8 * 1024, 8, 14336, 4096), (8 * 2048, 8, 7168, 2048),
                                             (32 * 512, 32, 7168, 2048)])
def test_grouped_tiles_are_not_192_wide(rows, groups, N, K):
    """Dense products of these shapes take 128 x 192 tiles; grouped ones ran them 5-9% slower
    than 128 x 256 ones (GROUPED_SLOW_WIDTHS)."""
    from numba_hopper.matmul.heuristics import tile_shape

    assert tile_shape(-(-rows // groups), N, K, groups, 132)[1] == 192
    cfg = grouped_config(_view((rows, K)), _view((K, N)), _view((rows, N)), "contiguous", groups, None, False,
                         limits=LIMITS)
    assert (cfg.block_m, cfg.block_n) == (128, 256)


# --- grouped_gemm()'s checks, before any GPU is needed ------------------------------------

_addresses = itertools.count(0x7F0000000000, 1 << 28)  # every fake array its own memory
R, K, N, G = 300, 64, 128, 4


def _t(shape, typestr="<u2", strides=None):
    return FakeCAI(shape, typestr, ptr=next(_addresses), strides=strides)


def _offsets(n=G, typestr="<i4"):
    return _t((n,), typestr)


def _call(a, b, sizes=None, masked=False, **kw):
    kw.setdefault("dtype", "bf16")
    if masked:
        return grouped_gemm(a, b, masked_m=sizes, **kw)
    return grouped_gemm(a, b, sizes, **kw)


def _reaches_gpu_check(monkeypatch, *args, **kw):
    monkeypatch.setattr(g, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        _call(*args, **kw)


def test_good_calls_reach_the_gpu_check(monkeypatch):
    _reaches_gpu_check(monkeypatch, _t((R, K)), _t((G, K, N)), _offsets())
    _reaches_gpu_check(monkeypatch, _t((R, K)), _t((G, K, N), strides=(2 * N * K, 2, 2 * K)), _offsets(),
                       row_scale=_t((R,), "<f4"), activation="silu", out_dtype="f32")  # b[g] column-major
    _reaches_gpu_check(monkeypatch, _t((G, 64, K)), _t((G, K, N)), _offsets(), masked=True,
                       out=_t((G, 64, N), "<f2"), dtype="f16", row_scale=_t((G, 64), "<f4"))


@pytest.mark.parametrize("args,kw,exc,msg", [
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets(typestr="<i8")), {}, DtypeError, "int32"),
    (lambda: (_t((R, K)), _t((G, K, N)), _t((G, 1), "<i4")), {}, ShapeError, "vector"),
    (lambda: (_t((R, K)), _t((G + 1, K, N)), _offsets()), {}, ShapeError, "b has 5 groups, offsets 4"),
    (lambda: (_t((R, K)), _t((G, K + 8, N)), _offsets()), {}, ShapeError, "K mismatch"),
    (lambda: (_t((R, K)), _t((K, N)), _offsets()), {}, ShapeError, r"\(G, K, N\)"),
    (lambda: (_t((G, R, K)), _t((G, K, N)), _offsets()), {}, ShapeError, r"\(rows, K\)"),
    (lambda: (_t((R, K), "<f4"), _t((G, K, N), "<f4"), _offsets()), dict(dtype=None), TypeError, "a.dtype"),
    (lambda: (_t((R, K), "|u1"), _t((G, K, N), "|u1"), _offsets()), dict(dtype="e4m3"), LayoutError,
     r"fp8 operands must be K-major.*w.transpose\(1, 2\)"),  # fp8 b[g] row-major
    (lambda: (_t((R, K), "<f2"), _t((G, K, N)), _offsets()), dict(dtype=None), DtypeError, "same dtype"),
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets()), dict(out=_t((R, N + 8), "<f2")), ShapeError, "out has shape"),
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets()), dict(out=_t((R, N), "<f2", strides=(2 * N + 16, 2))), LayoutError,
     "C-contiguous"),
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets()), dict(out=FakeCAI((R, N), "<f2", ptr=next(_addresses) + 8)),
     LayoutError, "16-byte-aligned"),
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets()), dict(row_scale=_t((R,), "<f2")), TypeError, "row_scale"),
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets()), dict(row_scale=_t((R + 1,), "<f4")), ShapeError, "row_scale"),
    (lambda: (_t((R, K)), _t((G, K, N)), _offsets()), dict(activation="tanh"), ValueError, "activation"),
    (lambda: (_t((R, 0)), _t((G, 0, N)), _offsets()), {}, ShapeError, "K > 0"),
    (lambda: (_t((R, K)), _t((G, K, 12)), _offsets()), {}, LayoutError, "b must hold"),
    (lambda: (_t((R, K)), _t((G, K, 4), strides=(8 * K, 2, 2 * K)), _offsets()), {}, LayoutError, "16-byte chunks"),
    (lambda: (_t((R, K), strides=(2, 2 * R)), _t((G, K, N)), _offsets()), {}, LayoutError, "a must hold row-major"),
    (lambda: (_t((R, K)), _t((G, K, N), strides=(0, 2 * N, 2)), _offsets()), {}, LayoutError, "b must hold"),
    (lambda: (_t((R, K)), _t((G, K, N)), np.zeros(G, np.int32)), {}, TypeError, "host"),
    (lambda: (_t((R, K)), _t((G, K, N)), None), {}, ValueError, "exactly one"),
])
def test_bad_calls_are_refused_before_launch(args, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(*args(), **kw)


def test_masked_checks():
    with pytest.raises(ShapeError, match="a has 3 groups, b 4, masked_m 4"):
        _call(_t((3, 64, K)), _t((G, K, N)), _offsets(), masked=True)
    with pytest.raises(ShapeError, match=r"\(G, M, K\)"):
        _call(_t((R, K)), _t((G, K, N)), _offsets(), masked=True)
    with pytest.raises(ShapeError, match="row_scale"):
        _call(_t((G, 64, K)), _t((G, K, N)), _offsets(), masked=True, row_scale=_t((G * 64,), "<f4"))
    with pytest.raises(ValueError, match="exactly one"):
        grouped_gemm(_t((G, 64, K)), _t((G, K, N)), _offsets(), masked_m=_offsets(), dtype="bf16")


def test_out_may_not_overlap_the_operands(monkeypatch):
    monkeypatch.setattr(g, "hopper_device_reason", lambda: "no GPU here")
    a = _t((R, K))
    with pytest.raises(OverlapError, match="out .* overlaps a"):
        _call(a, _t((G, K, N)), _offsets(), out=FakeCAI((R, N), "<f2", ptr=a.__cuda_array_interface__["data"][0]))


def test_operands_on_other_devices_are_refused():
    from numba_hopper.runtime.arrays import DeviceView

    b = DeviceView(0x7F0000000000, (G, K, N), (K * N, N, 1), "bf16", 2, 1, "cai")
    with pytest.raises(DeviceMismatchError, match="b is on device 1"):
        _call(_t((R, K)), b, _offsets())


def test_grouped_gemm_is_at_the_top_level():
    assert numba_hopper.grouped_gemm is grouped_gemm and "grouped_gemm" in numba_hopper.__all__


# --- the call path: one plan per layout, each call's addresses patched into its launch ----


class _FakeLaunch:
    """A prepared launch as far as plans go: where each argument leaf is, and what each call binds."""

    def __init__(self, args, calls):
        counter = itertools.count()

        def leaves(x):
            return [leaves(y) for y in x] if isinstance(x, tuple) else next(counter)

        self.leaves, self.calls = leaves(args), calls

    def __call__(self, stream, values, binds):
        self.calls.append({p: values[v] + offset for p, v, offset in binds})


@pytest.fixture
def fake_device(monkeypatch):
    """Plans built and run with no GPU: fake limits, templates, kernels, scratch and launches."""
    from numba_hopper.matmul import heuristics as _heuristics
    from numba_hopper.matmul import plan as _plan

    calls, prepared = [], []

    def prepare_launch(kernel, grid, block, args, **kw):
        prepared.append((grid, *args))
        return _FakeLaunch(args, calls)

    monkeypatch.setattr(g, "hopper_device_reason", lambda: None)
    g.clear_plans()  # (these plans launch nothing: they leave the cache empty, as the fixture ends)
    for mod in (_plan, _heuristics):
        monkeypatch.setattr(mod, "device_limits", lambda device: LIMITS)
    monkeypatch.setattr(_plan, "make_gemm_kernel", lambda cfg: None)
    monkeypatch.setattr(_plan, "encode_template", lambda *a, **kw: type("T", (), {"words": (0,) * 16}))
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    monkeypatch.setattr(_plan, "alloc_scratch", lambda device, stream, nbytes, zero_claims: 0x500000000000)
    monkeypatch.setattr(_plan, "free_scratch", lambda scratch, stream: None)
    yield calls, prepared
    g.clear_plans()


@pytest.mark.parametrize("masked", [False, True])
def test_one_plan_per_layout_and_each_calls_addresses(fake_device, masked):
    calls, prepared = fake_device
    for _ in range(3):
        a = _t((G, 64, K)) if masked else _t((R, K))
        b, sizes = _t((G, K, N)), _offsets()
        out = _t((G, 64, N) if masked else (R, N), "<f2")
        assert _call(a, b, sizes, masked=masked, out=out) is out
        addresses = {x.__cuda_array_interface__["data"][0] for x in (a, b, sizes, out)}
        assert addresses <= set(calls[-1].values())  # this call's a, b, out and sizes reached the kernel
    assert len(prepared) == 1 and len(calls) == 3  # one plan, three launches
    grid, params, _ = prepared[0]
    assert params.batches == G and params.a_batched == int(masked) and params.b_batched == 1
    rows = 64 if masked else R
    assert (params.M, params.N, params.K) == (rows, N, K)
    # the persistent grid: min(SMs, the bound on the tiles) whatever the sizes
    cfg = grouped_config(_view((rows, K)), _view((K, N)), _view((rows, N)), "masked" if masked else "contiguous", G,
                         None, False, limits=LIMITS)
    tiles_m, tiles_n = -(-rows // cfg.block_m), -(-N // cfg.block_n)
    assert grid == min(132, (G * tiles_m if masked else tiles_m + G) * tiles_n)


def test_a_new_layout_is_a_new_plan(fake_device):
    calls, prepared = fake_device
    _call(_t((R, K)), _t((G, K, N)), _offsets(), out=_t((R, N), "<f2"))
    _call(_t((R + 8, K)), _t((G, K, N)), _offsets(), out=_t((R + 8, N), "<f2"))  # other row count
    _call(_t((R, K)), _t((G, K, N), strides=(2 * N * K, 2, 2 * K)), _offsets(), out=_t((R, N), "<f2"))  # b[g] col-major
    _call(_t((R, K)), _t((G, K, N)), _offsets(), out=_t((R, N), "<f2"), activation=None)  # the first again
    assert len(prepared) == 3 and len(calls) == 4


# --- fp8 groups: block-wise scales ---------------------------------------------------------

def _fp8_grouped(mode, block_m=128, block_n=128, epilogue=None, block_scaled=True):
    stages = max_stages("e4m3", "bf16", block_n, a_major="K", b_major="K", block_m=block_m, epilogue=epilogue,
                        block_scaled=block_scaled)
    return GemmConfig("e4m3", "bf16", "K", "K", block_m=block_m, block_n=block_n, stages=stages, epilogue=epilogue,
                      grouped=mode, block_scaled=block_scaled)


# (config, the epilogue's argument types): B's scales (G, K/128, N/128) in both modes (the
# kernel's params; A's come by TMA); with alpha + row scale + silu beside them. The opt-in
# 192-wide tiles (two of B's scale blocks per tile) fit without spills only because the
# consumers' warpgroup index is known to be warp-uniform (gemm_sm90, the consumer): without
# that, 124 + 220 B.
FUSED = EpilogueConfig(alpha=True, row_scale=True, activation="silu")
FP8_KERNELS = [
    (_fp8_grouped("contiguous"), ()),
    (_fp8_grouped("masked"), ()),
    (_fp8_grouped("masked", 64, 128), ()),
    (_fp8_grouped("contiguous", 128, 64, FUSED), (types.float32, *VEC)),
    (_fp8_grouped("contiguous", 128, 192), ()),
    (_fp8_grouped("contiguous", 128, 192, FUSED), (types.float32, *VEC)),
]


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("cfg,ep_types", FP8_KERNELS, ids=[f"{c.grouped}-{c.block_m}x{c.block_n}"
                                                             f"{'-fused' if c.epilogue.alpha else ''}"
                                                             for c, _ in FP8_KERNELS])
def test_fp8_block_scaled_grouped_sass(cfg, ep_types):
    """fp8 wgmma (four k32 steps per k-block, each started afresh), a full wait, one FFMA per
    accumulator into the f32 sums, the guarded store beside the TMA one, no spills."""
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, ep_types))
    assert r.sass.count(f"QGMMA.64x{cfg.block_n}x32.F32.E4M3.E4M3 ") == 4 and r.count("HGMMA") == 0, r.summary()
    assert ", RZ, !UPT" in r.sass and "WARPGROUP.DEPBAR.LE gsb0, 0x0" in r.sass
    assert r.count("FFMA") >= cfg.block_n // 2
    assert r.count("UTMASTG") >= 1 and r.count("STG.E.128") >= 1, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert cfg.consumers == 1 or not r.warpsync_before_wgmma


def test_fp8_per_tensor_grouped_sass():
    """Without block scales: fp8 wgmma accumulating across k-blocks, alpha in the epilogue."""
    cfg = _fp8_grouped("masked", 128, 256, EpilogueConfig(alpha=True), block_scaled=False)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (types.float32,)))
    assert r.sass.count("QGMMA.64x256x32.F32.E4M3.E4M3 ") == 4 and r.count("HGMMA") == 0, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


def _fp8_view(shape, strides):
    from numba_hopper.runtime.arrays import DeviceView

    return DeviceView(0x7F0000000000, shape, strides, "e4m3", 1, 0, "torch")


@pytest.mark.parametrize("mode,rows,groups,N,tile", [
    ("contiguous", 8 * 2048, 8, 4096, (128, 128)), ("contiguous", 32 * 512, 32, 7168, (128, 128)),
    ("masked", 256, 16, 4096, (128, 128)),
    ("masked", 64, 16, 4096, (64, 128)),  # 64 rows a group: the same waves of half the tile
    ("masked", 128, 1, 7168, (128, 64)),  # 56 128-wide tiles would leave most SMs idle
])
def test_fp8_block_scaled_grouped_tiles_are_at_most_128_wide(mode, rows, groups, N, tile):
    K = 7168
    cfg = grouped_config(_fp8_view((rows, K), (K, 1)), _fp8_view((K, N), (1, K)), _view((rows, N)), mode, groups,
                         None, False, limits=LIMITS, block_scaled=True)
    assert (cfg.block_m, cfg.block_n) == tile and cfg.block_scaled and cfg.grouped == mode
    assert (cfg.in_dtype, cfg.a_major, cfg.b_major) == ("e4m3", "K", "K") and cfg.shared_bytes <= 227 * 1024


# grouped_gemm()'s fp8 checks. KB = 256: two K blocks; N = 128: one N block.
KB = 256


def _f8(shape, strides=None):
    return _t(shape, "|u1", strides)


def _f8_b(g=G, k=KB, n=N):
    """(G, K, N), each b[g] column-major: a contiguous (G, N, K) weight's transpose(1, 2)."""
    return _f8((g, k, n), strides=(n * k, 1, k))


def _f32(shape, strides=None):
    return _t(shape, "<f4", strides)


def _scales(masked=False, rows=R, g=G):
    """Block-wise ``(scale_a, scale_b)`` in torch's strides (scale_a column-major per group)."""
    sa = _f32((g, 64, 2), strides=(4 * 2 * 64, 4, 4 * 64)) if masked else _f32((rows, 2), strides=(4, 4 * rows))
    return sa, _f32((g, 2, 1))


def test_fp8_calls_reach_the_gpu_check(monkeypatch):
    sa, sb = _scales()
    _reaches_gpu_check(monkeypatch, _f8((R, KB)), _f8_b(), _offsets(), dtype="e4m3", scale_a=sa, scale_b=sb)
    sa, sb = _scales(masked=True)
    _reaches_gpu_check(monkeypatch, _f8((G, 64, KB)), _f8_b(), _offsets(), masked=True, dtype="e5m2", scale_a=sa,
                       scale_b=sb, row_scale=_f32((G, 64)), activation="silu", out=_t((G, 64, N), "<f4"))
    # row-major scales (DeepGEMM's), per-tensor numbers, no scales
    _reaches_gpu_check(monkeypatch, _f8((R, KB)), _f8_b(), _offsets(), dtype="e4m3", scale_a=_f32((R, 2)),
                       scale_b=_f32((G, 2, 1)))
    _reaches_gpu_check(monkeypatch, _f8((R, KB)), _f8_b(), _offsets(), dtype="e4m3", scale_a=0.5, scale_b=2)
    _reaches_gpu_check(monkeypatch, _f8((R, KB)), _f8_b(), _offsets(), dtype="e4m3")
    _reaches_gpu_check(monkeypatch, _t((R, KB)), _t((G, KB, N)), _offsets(), scale_a=2.0)  # numbers: 16-bit too


def _fp8_call(masked=False, **kw):
    a = _f8((G, 64, KB)) if masked else _f8((R, KB))
    kw.setdefault("dtype", "e4m3")
    return _call(a, kw.pop("b", None) or _f8_b(), _offsets(), masked=masked, **kw)


def _dv(shape, strides, dtype, device=0):
    from numba_hopper.runtime.arrays import DeviceView

    return DeviceView(next(_addresses), shape, strides, dtype, 4 if dtype == "f32" else 1, device, "cai")


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("scales,exc,msg", [
    (lambda m: (_scales(m)[0], None), ShapeError, "scale_b has none"),
    (lambda m: (_scales(m)[0], 1.5), ShapeError, "scale_b has a number"),
    (lambda m: (0.5, _scales(m)[1]), ShapeError, "scale_a has a number"),
    (lambda m: (_f32((R, 3)), _scales(m)[1]), ShapeError, r"scale_a has shape \(300, 3\)"),
    (lambda m: (_scales(m)[0], _f32((2, 1))), ShapeError, r"scale_b of shape \(4, 2, 1\)"),
    (lambda m: (_f32((1,)), _f32((1,))), ShapeError, "per-tensor scales: Python numbers"),
    (lambda m: (_f32((R,)), _f32((N,))), ShapeError, "row-wise .* not supported"),
    (lambda m: (_scales(m)[0], _t((G, 2, 1), "<f8")), DtypeError, "scale_b.dtype"),
    (lambda m: (_scales(m)[0], _f32((G, 2, 1), strides=(8, 4, -4))), LayoutError, "scale_b has negative strides"),
])
def test_bad_fp8_scales_are_refused(masked, scales, exc, msg):
    sa, sb = scales(masked)
    with pytest.raises(exc, match=msg):
        _fp8_call(masked, scale_a=sa, scale_b=sb)


def test_masked_scale_a_has_a_group_dimension():
    with pytest.raises(ShapeError, match=r"scale_a of shape \(4, 64, 2\).*scale_a has shape \(256, 2\)"):
        _fp8_call(True, scale_a=_f32((G * 64, 2)), scale_b=_f32((G, 2, 1)))


def test_fp8_layouts_and_dtypes_are_checked():
    sa, sb = _scales()
    with pytest.raises(LayoutError, match="fp8 operands must be K-major"):  # each b[g] row-major
        _fp8_call(b=_f8((G, KB, N)), scale_a=sa, scale_b=sb)
    with pytest.raises(LayoutError, match="K bytes|16-byte"):  # K = 8: rows of 8 bytes
        _call(_f8((R, 8)), _f8((G, 8, N), strides=(8 * N, 1, 8)), _offsets(), dtype="e4m3")
    with pytest.raises(DtypeError, match="mixed e4m3 x e5m2"):
        _call(_dv((R, KB), (KB, 1), "e4m3"), _dv((G, KB, N), (N * KB, 1, KB), "e5m2"), _offsets(), dtype=None)
    with pytest.raises(DtypeError, match="block-wise scales are for fp8"):
        _call(_t((R, KB)), _t((G, KB, N)), _offsets(), scale_a=sa, scale_b=sb)
    with pytest.raises(DtypeError, match="gemm writes fp8"):
        _fp8_call(out_dtype="e4m3")
    with pytest.raises(DeviceMismatchError, match="scale_b is on device 1"):
        _fp8_call(scale_a=sa, scale_b=_dv((G, 2, 1), (2, 1, 1), "f32", device=1))


def test_out_may_not_overlap_the_scales(monkeypatch):
    monkeypatch.setattr(g, "hopper_device_reason", lambda: "no GPU here")
    sa, sb = _scales()
    with pytest.raises(OverlapError, match="out .* overlaps scale_a"):
        _fp8_call(scale_a=sa, scale_b=sb, out=FakeCAI((R, N), "<u2", ptr=sa.__cuda_array_interface__["data"][0]),
                  out_dtype="bf16")


@pytest.mark.parametrize("masked", [False, True])
def test_fp8_block_scales_reach_the_kernel_each_call(fake_device, monkeypatch, masked):
    """One plan; each call's scales (and operands) bound into the launch; a block-scaled fp8
    kernel of the grouped mode, at most 128 wide, which reads A's scales through its last
    tensor map (torch's strides: no copy) and B's from its params (the mainloop's, not among
    the epilogue's arguments)."""
    from numba_hopper.matmul import plan as _plan

    calls, prepared = fake_device
    configs = []
    monkeypatch.setattr(_plan, "make_gemm_kernel", configs.append)
    monkeypatch.setattr(_plan, "numba_array", lambda v, typestr=None: v)  # (no CUDA driver here)
    first = None
    for _ in range(3):
        sa, sb = _scales(masked)
        out = _t((G, 64, N) if masked else (R, N), "<u2")
        _fp8_call(masked, scale_a=sa, scale_b=sb, out=out, out_dtype="bf16")
        addresses = {x.__cuda_array_interface__["data"][0] for x in (sa, sb, out)}
        assert addresses <= set(calls[-1].values())
        first = first or sa.__cuda_array_interface__["data"][0]
    assert len(prepared) == 1 and len(calls) == 3
    cfg = configs[0]
    assert cfg.grouped == ("masked" if masked else "contiguous") and cfg.block_scaled and cfg.block_n <= 128
    assert (cfg.in_dtype, cfg.out_dtype, cfg.b_major) == ("e4m3", "bf16", "K") and not cfg.epilogue.alpha
    params, ep = prepared[0][1], prepared[0][2]
    assert len(params.maps) == cfg.tensormaps == 4 and params.maps[-1].value == first
    assert params.b_scales.shape == (G, 2, 1) and "b_block_scales" not in ep._fields


def test_fp8_per_tensor_numbers_fold_into_alpha(fake_device, monkeypatch):
    from numba_hopper.matmul import plan as _plan

    calls, prepared = fake_device
    configs = []
    monkeypatch.setattr(_plan, "make_gemm_kernel", configs.append)
    _fp8_call(scale_a=0.5, scale_b=3.0, out=_t((R, N), "<u2"), out_dtype="bf16")
    _fp8_call(scale_a=2.0, scale_b=0.25, out=_t((R, N), "<u2"), out_dtype="bf16")  # same plan, new alpha
    assert len(prepared) == 1 and configs[0].epilogue.alpha and not configs[0].block_scaled
    assert prepared[0][2].alpha == 1.5 and 0.5 in calls[1].values()  # each call's alpha is bound
    _fp8_call(out=_t((R, N), "<u2"), out_dtype="bf16")  # no scales: the plain fp8 kernel, promoted
    assert len(prepared) == 2 and configs[1].epilogue is None and configs[1].promoted
    _fp8_call(out=_t((R, N), "<u2"), out_dtype="bf16", use_fast_accum=True)  # accumulated in the tensor cores
    assert len(prepared) == 3 and configs[2].epilogue is None and not configs[2].promoted
