"""FP8 GEMM on a CPU: what its kernels compile to, its config rules and gemm()'s fp8 checks
(fake arrays; nothing reaches a GPU)."""

import dataclasses
import itertools

import pytest
from numba.cuda import types

from _fakes import FakeCAI
from test_gemm_cpu import _k_block_loop
import numba_hopper.matmul.api as g
import numba_hopper.matmul.plan_cache as plan_cache
from numba_hopper import gemm
from numba_hopper.matmul.heuristics import max_stages
from numba_hopper.errors import DtypeError, LayoutError, ShapeError
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.epilogue import EpilogueConfig
from numba_hopper.kernels.gemm_config import LONE_CONSUMER_RUN, GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.tools.sass import inspect_kernel


def _fp8(in_dtype="e4m3", out_dtype="bf16", block_m=128, block_n=256, epilogue=None, block_scaled=False):
    stages = max_stages(in_dtype, out_dtype, block_n, a_major="K", b_major="K", block_m=block_m, epilogue=epilogue,
                        block_scaled=block_scaled)
    return GemmConfig(in_dtype, out_dtype, "K", "K", block_m=block_m, block_n=block_n, stages=stages,
                      epilogue=epilogue, block_scaled=block_scaled)


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("cfg", [_fp8(), _fp8("e5m2", "f32", block_m=64, block_n=128),
                                 GemmConfig("e4m3", "f32", "K", "K", block_n=128, stream_k=True)],
                         ids=["e4m3-bf16-128x256", "e5m2-f32-64x128", "e4m3-f32-128x128-stream_k"])
def test_fp8_sass_has_fp8_wgmma_and_no_spills(cfg):
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    t = cfg.in_dtype.upper()
    # nvdisasm names fp8 wgmma QGMMA; 4 k32 steps per 128-byte k-block
    assert r.count("QGMMA") >= 4, r.summary()
    assert f"QGMMA.64x{cfg.block_n}x32.F32.{t}.{t} " in r.sass
    assert r.count("HGMMA") == 0
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("UTMALDG") > 0 and not r.setmaxnreg_ignored


def test_fp8_fused_epilogue_compiles_without_spills():
    """Per-tensor scales as stride-0 vectors, bias and gelu_tanh on an fp8 product."""
    ecfg = EpilogueConfig(alpha=True, row_scale=True, col_scale=True, bias="col", bias_dtype="bf16",
                          activation="gelu_tanh")
    cfg = _fp8(epilogue=ecfg)
    vec = types.Array(types.float32, 1, "A")
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (types.float32, vec, vec,
                                                                         types.uint16[::1])))
    assert r.count("QGMMA") >= 4 and "QGMMA.64x256x32.F32.E4M3.E4M3 " in r.sass
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


def test_fp8_k_blocks_are_128_bytes():
    cfg = _fp8()
    assert cfg.block_k == 128 and cfg.a_box == (1, 128, 128) and cfg.b_box == (1, 256, 128)
    assert cfg.a_tile_bytes == 128 * 128 and cfg.b_tile_bytes == 256 * 128
    bf16 = GemmConfig()
    assert bf16.block_k == 64 and bf16.a_tile_bytes == cfg.a_tile_bytes  # the same bytes per stage
    assert max_stages("e4m3", "bf16", 256, a_major="K", b_major="K") == max_stages("bf16", "bf16", 256)


@pytest.mark.parametrize("majors", [("M", "K"), ("K", "N"), ("M", "N")])
def test_fp8_config_needs_k_major_operands(majors):
    with pytest.raises(ValueError, match="K-major"):
        GemmConfig("e4m3", "bf16", *majors)


# --- gemm()'s fp8 checks, before any GPU is needed ---------------------------------------------

_addresses = itertools.count(0x7F0000000000, 1 << 24)  # every fake array its own memory
M, N, K = 4, 6, 32


def _a(m=M, k=K, typestr="|u1", strides=None):
    """Row-major (M, K) bytes."""
    return FakeCAI((m, k), typestr, ptr=next(_addresses), strides=strides)


def _b(k=K, n=N, typestr="|u1"):
    """Column-major (K, N) bytes: the transpose of a row-major (N, K) weight."""
    return FakeCAI((k, n), typestr, ptr=next(_addresses), strides=(1, k))


def _v(n, typestr="<f4"):
    return FakeCAI((n,), typestr, ptr=next(_addresses))


def _call(a, b, **kw):
    return gemm(a, b, dtype="e4m3", **kw)


def _reaches_gpu_check(monkeypatch, a, b, **kw):
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        _call(a, b, **kw)


def test_tn_operands_reach_the_gpu_check(monkeypatch):
    _reaches_gpu_check(monkeypatch, _a(), _b())
    _reaches_gpu_check(monkeypatch, _a(), _b(), scale_a=_v(M), scale_b=_v(N), out_dtype="f32")
    _reaches_gpu_check(monkeypatch, _a(1, 16), _b(16, 1), scale_a=0.5, scale_b=FakeCAI((), "<f4"))


@pytest.mark.parametrize("a,b,msg", [
    (lambda: FakeCAI((M, K), "|u1", ptr=next(_addresses), strides=(1, M)), _b, "a .* must be row-major"),
    (_a, lambda: FakeCAI((K, N), "|u1", ptr=next(_addresses)), "pass b as w.t()"),
    (lambda: _a(k=24), lambda: _b(k=24), "multiple of 16 bytes"),
    (lambda: FakeCAI((M, K), "|u1", ptr=next(_addresses) + 8), _b, "16-byte-aligned"),
])
def test_fp8_layouts_are_refused_before_launch(a, b, msg):
    with pytest.raises(LayoutError, match=msg):
        _call(a(), b())


def test_mixed_fp8_dtypes_reach_the_gpu_check(monkeypatch):
    from numba_hopper.runtime.arrays import device_view

    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: "no GPU here")
    for ta, tb in (("e4m3", "e5m2"), ("e5m2", "e4m3")):
        with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
            gemm(device_view(_a(), dtype=ta), device_view(_b(), dtype=tb))
    with pytest.raises(DtypeError, match="same dtype"):
        gemm(device_view(_a(), dtype="e4m3"), device_view(FakeCAI((K, N), "<u2", ptr=next(_addresses)), dtype="bf16"))


def test_mixed_fp8_kernel():
    cfg = GemmConfig("e4m3", "bf16", "K", "K", block_n=128, stages=4, b_dtype="e5m2")
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    assert "QGMMA.64x128x32.F32.E4M3.E5M2 " in r.sass, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    with pytest.raises(ValueError, match="b_dtype is for fp8"):
        GemmConfig("bf16", "bf16", b_dtype="e5m2")


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(scale_a=_v(N)), ShapeError, "scale_a has shape"),
    (dict(scale_b=_v(M)), ShapeError, "scale_b has shape"),
    (dict(scale_a=_v(M, "<f2")), DtypeError, "scale_a must be float32"),
    (dict(scale_b=FakeCAI((N,), "<f8")), DtypeError, "scale_b must be float32"),
    (dict(scale_a=FakeCAI((M, 2), "<f4")), ShapeError, "scale_a has shape"),  # K = 32: one K block
    (dict(scale_b=FakeCAI((1, 2), "<f4")), ShapeError, "scale_b has shape"),
    (dict(scale_a=_v(M), row_scale=_v(M)), ValueError, "pass one of them"),
    (dict(scale_b=FakeCAI((), "<f4"), col_scale=_v(N)), ValueError, "pass one of them"),
])
def test_bad_fp8_options_are_refused(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(_a(), _b(), **kw)


def _folded(monkeypatch, **kw):
    """What gemm() hands its first-call path: the fused epilogue's keywords."""
    seen = {}

    def first(key, a, b, out, f, fvalues, *rest):
        seen.update(f or {})
        return f

    monkeypatch.setattr(g, "_first_gemm", first)
    g.clear_plans()
    f = _call(_a(), _b(), **kw)
    return f


def test_scales_fold_into_the_epilogue(monkeypatch):
    assert _folded(monkeypatch, scale_a=2.0, scale_b=1.0, alpha=0.5) is None  # 2 * 1 * 0.5 == 1: plain
    f = _folded(monkeypatch, scale_a=2.0, scale_b=3.0)
    assert f["alpha"] == 6.0 and f["row_scale"] is None and f["col_scale"] is None
    sa, sb = _v(M), FakeCAI((1, 1), "<f4", ptr=next(_addresses))
    f = _folded(monkeypatch, scale_a=sa, scale_b=sb, alpha=2.0)
    assert f["alpha"] == 2.0
    assert f["row_scale"].__cuda_array_interface__["strides"] == (4,)
    col = f["col_scale"].__cuda_array_interface__
    assert col["shape"] == (N,) and col["strides"] == (0,)  # one element for every column
    assert col["data"] == sb.__cuda_array_interface__["data"]
    # torch._scaled_mm's row-wise shapes (M, 1) and (1, N)
    f = _folded(monkeypatch, scale_a=FakeCAI((M, 1), "<f4", ptr=next(_addresses)),
                scale_b=FakeCAI((1, N), "<f4", ptr=next(_addresses)))
    assert f["row_scale"].__cuda_array_interface__["shape"] == (M,)
    assert f["col_scale"].__cuda_array_interface__["strides"] == (4,)


# --- block-wise scales (K = 256: two K blocks) -------------------------------------------------

KB = 256


def _block(shape, typestr="<f4", strides=None):
    return FakeCAI(shape, typestr, ptr=next(_addresses), strides=strides)


def test_block_wise_scales_reach_the_gpu_check(monkeypatch):
    # torch's layouts: scale_a (M, K/128) with strides (1, M), scale_b (K/128, N/128)
    _reaches_gpu_check(monkeypatch, _a(k=KB), _b(k=KB), scale_a=_block((M, 2), strides=(4, 4 * M)),
                       scale_b=_block((2, 1)))
    # with the rest of the fused epilogue after it
    _reaches_gpu_check(monkeypatch, _a(k=KB), _b(k=KB), scale_a=_block((M, 2)), scale_b=_block((2, 1)),
                       col_scale=_v(N), activation="silu", out_dtype="f32")


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(scale_a=_block((M, 2))), ShapeError, "scale_b has none"),
    (dict(scale_a=_block((M, 2)), scale_b=1.5), ShapeError, "scale_b has a number"),
    (dict(scale_a=_block((M, 2)), scale_b=_v(N)), ShapeError, r"scale_b has shape \(6,\)"),
    (dict(scale_a=_v(M), scale_b=_block((2, 1))), ShapeError, r"scale_a of shape \(4, 2\)"),
    (dict(scale_a=_block((M, 2)), scale_b=_block((2, 1), "<f8")), DtypeError, "scale_b must be float32"),
    (dict(scale_a=_block((M, 2)), scale_b=_block((2, 1)), out=FakeCAI((M, N), "<f4", ptr=0x7D0000000000,
                                                                          strides=(4, 4 * M))),
     LayoutError, "row-major out"),
])
def test_bad_block_wise_scales_are_refused(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(_a(k=KB), _b(k=KB), **kw)


def test_block_wise_scales_need_fp8():
    a = FakeCAI((M, KB), "<u2", ptr=next(_addresses))
    b = FakeCAI((KB, N), "<u2", ptr=next(_addresses))
    with pytest.raises(DtypeError, match="block-wise scales are for fp8"):
        gemm(a, b, dtype="bf16", scale_a=_block((M, 2)), scale_b=_block((2, 1)))


def test_block_wise_tile_choice():
    """128 x 256, 192 x 128 and 128 x 192 tiles where they waste no more of a wave than 128 x 128
    ones, 64 x 128 ones where 128 x 128 ones leave SMs idle (measured: benchmarks/NOTES.md); never
    wide tiles with column vectors, nor in grouped products; unpaired tiles at their own costs."""
    from numba_hopper.matmul.heuristics import promoted_tile

    K = 4096  # 32 k-blocks
    assert promoted_tile(4096, 4096, K, 132) == (128, 256)  # 4 full waves (704 192-wide tiles: 6, a third empty)
    assert promoted_tile(4096, 7168, K, 132) == (128, 256)
    assert promoted_tile(128, 7168, K, 132) == (64, 128)  # 112 tiles fill the GPU where 56 would not
    assert promoted_tile(4096, 2112, K, 132) == (128, 192)  # 3 waves, not 5 (256: 3 waves of larger tiles)
    assert promoted_tile(8192, 8192, K, 132) == (128, 192)  # 21 waves of 1.47 against 16 of 1.96
    assert promoted_tile(128, 24576, K, 132) == (128, 192)  # one full wave, not two
    # a long K (48 k-blocks on): 14 waves of paired 128 x 128 tiles against 7 of 128 x 256 ones at 2.06
    assert promoted_tile(4096, 7168, 16384, 132) == (128, 128)
    assert promoted_tile(4096, 4096, 7168, 132) == (128, 128)  # 56 k-blocks: 4 waves at 2.06 against 8
    assert promoted_tile(4096, 7168, 16384, 132, paired=False) == (128, 256)
    # three consumers: 192 x 128 where its waves are full (a plain product with a 16- or 32-bit output)
    assert promoted_tile(8192, 8192, K, 132, tall=True) == (192, 128)  # 21 full waves
    assert promoted_tile(8192, 8192, 8192, 132, tall=True) == (192, 128)
    assert promoted_tile(4096, 24576, K, 132, tall=True) == (192, 128)  # 32 exactly
    assert promoted_tile(4096, 4096, K, 132, tall=True) == (128, 256)  # 704 192-row tiles: 6 waves, not 4
    assert promoted_tile(128, 24576, K, 132, tall=True) == (128, 192)
    assert promoted_tile(128, 7168, K, 132, paired=False) == (128, 64)  # one consumer, unpaired, idles
    for M, N in itertools.product((1, 128, 1000, 4096), (128, 2112, 7168)):
        assert promoted_tile(M, N, K, 132, wide=False)[1] <= 128
        assert promoted_tile(M, N, K, 132, units=8, wide=False, paired=False)[1] <= 128
    for feature in ("block_scaled", "promoted"):
        with pytest.raises(ValueError, match="needs fp8"):
            GemmConfig("bf16", "bf16", "K", "K", block_n=128, **{feature: True})


def test_unscaled_promotion_tile_choice():
    """Per-tensor and row-wise promotion (no block-wise scales) price a 128 x 256 tile at
    ``UNSCALED_WIDE_TILE_COST``: 4096^3 and 4096x7168x2048 take paired 128 x 128 tiles (8 waves
    against 4 of 2.08), which keep two output buffers per consumer (no scale box to make room
    for). Their scales leave three consumers the registers of 192 x 128 tiles: 8192^3 and
    4096x2112x7168 take them (21 waves of 1.44 against 32; 3 against 5), row-wise vectors and
    per-tensor device scales alike; a host number's 128 x 192 ties below them. Block-wise
    scales keep their prices and the single output buffer."""
    from numba_hopper.matmul.heuristics import promoted_tile

    rowwise = EpilogueConfig(row_scale=True, col_scale=True)
    for (M, N, K), tile in (((4096, 4096, 4096), (128, 128)), ((4096, 7168, 2048), (128, 128)),
                            ((8192, 8192, 8192), (192, 128)), ((4096, 2112, 7168), (192, 128))):
        assert promoted_tile(M, N, K, 132, tall=True, block_scales=False) == tile
        for scales in (PER_TENSOR_DEVICE_SCALES, rowwise, EpilogueConfig(alpha=True)):
            cfg = _choose(M, N, K, "bf16", scales, promoted=True)
            assert (cfg.block_m, cfg.block_n) == tile and cfg.epi_buffers == 2 and cfg.shared_bytes <= 227 * 1024
    # other epilogue terms, or an fp8 output, keep two consumers
    assert _choose(8192, 8192, 8192, "bf16", EpilogueConfig(bias="row"), promoted=True).block_m == 128
    assert _choose(8192, 8192, 8192, "e4m3", EpilogueConfig(out_scale="number"), promoted=True).block_m == 128
    assert promoted_tile(4096, 4096, 4096, 132) == (128, 256)
    assert _choose(4096, 4096, 7168, "bf16", EpilogueConfig()).epi_buffers == 1
    # a lone consumer's runs: 64-row tiles without block-wise scales
    small = _choose(128, 7168, 16384, "bf16", PER_TENSOR_DEVICE_SCALES, promoted=True)
    assert (small.block_m, small.promotion_run) == (64, LONE_CONSUMER_RUN)
    assert _choose(128, 7168, 16384, "bf16", EpilogueConfig()).promotion_run == 2


def test_unscaled_192_row_tiles_take_the_scales():
    """Without block-wise scales a 192-row promoted tile runs a scale-only epilogue (the
    registers B's scales would take hold the row and column scales); other terms, and block
    scales with more than alpha, are refused."""
    fp8 = ("e4m3", "bf16", "K", "K")
    for scales in (PER_TENSOR_DEVICE_SCALES, EpilogueConfig(row_scale=True, col_scale=True)):
        assert GemmConfig(*fp8, block_m=192, block_n=128, stages=4, epilogue=scales, promoted=True).block_m == 192
    for kw in (dict(epilogue=EpilogueConfig(bias="row"), promoted=True),
               dict(epilogue=EpilogueConfig(row_scale=True), block_scaled=True)):
        with pytest.raises(ValueError, match="promoted 192-row tiles run with"):
            GemmConfig(*fp8, block_m=192, block_n=128, stages=4, **kw)


@pytest.mark.parametrize("out_dtype,epilogue,tile", [
    ("bf16", EpilogueConfig(), (128, 128, 1, 6)), ("f32", EpilogueConfig(), (128, 128, 1, 6)),
    ("bf16", EpilogueConfig(col_scale=True), (128, 128, 1, 6)),
    ("bf16", EpilogueConfig(bias="col"), (128, 128, 2, 5))])  # (unpaired)
def test_block_wise_paired_tiles_take_a_sixth_slot(out_dtype, epilogue, tile):
    """A paired 128 x 128 tile (4096x4096x7168; paired with an epilogue that only scales) gives
    up an output buffer per consumer for a sixth ring slot, three pairs of k-blocks; an unpaired
    one keeps both."""
    cfg = _choose(4096, 4096, 7168, out_dtype, epilogue)
    assert (cfg.block_m, cfg.block_n, cfg.epi_buffers, cfg.stages) == tile
    assert cfg.promotes_in_pairs == (tile[2] == 1) and cfg.shared_bytes <= 227 * 1024


def _choose(M, N, K, out_dtype, epilogue, promoted=False):
    """``choose_config``'s kernel of a block-scaled (``promoted``: promoted, unscaled) e4m3 TN
    product on an H100's 132 SMs."""
    from numba_hopper.runtime.arrays import DeviceView
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.runtime.launch import DeviceLimits

    def view(rows, cols, dtype, strides=None):
        return DeviceView(0x7F0000000000, (rows, cols), strides or (cols, 1), dtype, 1, 0, "torch")

    return choose_config(view(M, K, "e4m3"), view(K, N, "e4m3", (1, K)), view(M, N, out_dtype), None, False, epilogue,
                         limits=DeviceLimits(0, (9, 0), 132), block_scaled=not promoted, promoted=promoted)


@pytest.mark.parametrize("out_dtype,epilogue,block_m", [
    ("bf16", EpilogueConfig(), 192), ("f32", EpilogueConfig(alpha=True), 192),
    ("e4m3", EpilogueConfig(out_scale="number", amax=True), 128),  # an fp8 output's amax
    ("bf16", EpilogueConfig(row_scale=True), 128)])
def test_block_wise_192_row_tiles_only_for_plain_products(out_dtype, epilogue, block_m):
    """8192^3 takes three consumers' 192 x 128 tiles where the epilogue leaves them the registers."""
    cfg = _choose(8192, 8192, 8192, out_dtype, epilogue)
    assert cfg.block_m == block_m and cfg.shared_bytes <= 227 * 1024


def test_block_wise_wide_tiles():
    """192-wide block-scaled tiles run with 64 or 128 rows, 256-wide ones (two halves a k-block)
    with 128, ungrouped; both without column vectors, whose staged terms would spill."""
    fp8 = ("e4m3", "bf16", "K", "K")
    for block_m in (128, 64):
        assert GemmConfig(*fp8, block_m=block_m, block_n=192, block_scaled=True).block_scaled
    assert GemmConfig(*fp8, block_n=256, stages=4, block_scaled=True).block_scaled
    GemmConfig(*fp8, block_n=192, epilogue=EpilogueConfig(row_scale=True, activation="gelu_tanh"), block_scaled=True)
    with pytest.raises(ValueError, match="block_n = 160 runs without a fused epilogue"):
        GemmConfig(*fp8, block_n=160, block_scaled=True)
    for kw in (dict(block_m=64), dict(grouped="contiguous")):
        with pytest.raises(ValueError, match="256-wide tiles run with block_m = 128, ungrouped"):
            GemmConfig(*fp8, block_n=256, block_scaled=True, **kw)
    # three consumers (192 rows) take turns too, on tiles up to 128 wide
    assert GemmConfig(*fp8, block_m=192, block_n=128, stages=4, block_scaled=True).block_scaled
    with pytest.raises(ValueError, match="promotion over 128 columns"):
        GemmConfig(*fp8, block_m=192, block_n=192, block_scaled=True)
    for width, columns in itertools.product((192, 256), (dict(col_scale=True), dict(bias="col"))):
        with pytest.raises(ValueError, match="tiles over 128 wide run without column vectors"):
            GemmConfig(*fp8, block_n=width, epilogue=EpilogueConfig(**columns), block_scaled=True)


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 64), (64, 128), (128, 192), (64, 192), (128, 256),
                                             (192, 128)])
def test_block_wise_sass_promotes_every_k_block(block_m, block_n):
    """Each k-block: A's scales loaded by TMA with the k-block, four k32 QGMMAs started afresh
    (a 256-wide tile: four for each 128-column half), a full wait, then one FFMA per sum (a
    192-wide tile too: its two scale blocks are chosen once per k-block, not per register).
    Tiles of at most 128 x 128 issue pairs of k-blocks into two accumulators and wait for the
    first with the second in flight (no C7514 serialization), and an odd item's last k-block
    alone: three copies of that code. No spills: 96 sums beside 96 accumulators (128 beside 64,
    64 beside 64 + 64) fit in the consumers' 240 registers (255 for a single 64-row consumer).
    The k-block loop moves no wgmma descriptor into a uniform register (R2UR): the warpgroup
    index is broadcast. B's scales load (from global memory) after the loop's first wgmmas are
    issued, not between the last promotion and the next issue."""
    cfg = _fp8(block_m=block_m, block_n=block_n, block_scaled=True)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, ()))  # B's scales in params; A's by TMA
    mma_n = 128 if block_n == 256 else block_n  # a 256-wide tile: two 128-column halves
    copies = 3 if cfg.promotes_in_pairs else 1
    assert cfg.promotes_in_pairs == (block_n <= 128 and block_m <= 128)
    assert r.sass.count(f"QGMMA.64x{mma_n}x32.F32.E4M3.E4M3 ") == copies * 4 * block_n // mma_n, r.summary()
    assert ", RZ, !UPT" in r.sass  # scale_d = 0: each k-block's product starts from zero
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" in r.sass
    assert ("WARPGROUP.DEPBAR.LE gsb0, 0x1" in r.sass) == cfg.promotes_in_pairs
    assert not [w for w in r.warnings if "C7514" in w or "C7517" in w], r.warnings
    assert r.count("FFMA") == copies * block_n // 2, r.summary()
    assert r.count("UTMALDG") > 14 and r.count("LDS") >= 2  # the scales' loads, then their reads
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    loop = _k_block_loop(r.sass)
    assert not [line for line in loop if "R2UR" in line]
    first_issue = next(i for i, line in enumerate(loop) if "QGMMA" in line)
    assert not [line for line in loop[:first_issue] if " LD.E " in line or " LDG.E" in line], loop[:first_issue]
    assert [line for line in loop[first_issue:] if " LD.E " in line or " LDG.E" in line]


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 256), (192, 128), (64, 128), (64, 64)])
def test_promoted_sass_adds_every_k_block_without_scales(block_m, block_n):
    """The default fp8 product (``promoted``, no block-wise scales) runs the block-wise loops with
    the scales folded away: per k-block one add per accumulator register (FADD, or FFMA by the
    constant 1 in the 128 x 256 halves), no scale box in the ring (3 tensor maps) and no load of
    B's scales; the plain output store (no epilogue), no spills. A lone consumer (64-row tiles)
    runs ``LONE_CONSUMER_RUN`` k-blocks at a time, each accumulator given its next k-block once
    promoted: the code of a run, a pair (an item's last pairs) and a last k-block, with no C7514
    serialization. Two or three consumers issue an item's first k-block before the previous
    tile's store (``overlaps_store``): its code, then (paired) the first pair's second k-block,
    a pair and a last k-block, or the loop; promoted alone (an item of one k-block, or three
    consumers), it is copied into the sums, not added."""
    stages = max_stages("e4m3", "bf16", block_n, a_major="K", b_major="K", block_m=block_m, promoted=True)
    cfg = GemmConfig("e4m3", "bf16", "K", "K", block_m=block_m, block_n=block_n, stages=stages, promoted=True)
    assert cfg.epilogue is None and cfg.tensormaps == 3 and cfg.a_scales_bytes == 0
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    assert cfg.promotes_in_pairs == (block_n <= 128 and block_m <= 128)
    assert cfg.promotion_run == (LONE_CONSUMER_RUN if block_m == 64 else 2)
    assert cfg.overlaps_store == (block_m > 64 and block_n <= 128)
    copies = (cfg.promotion_run + 2 + 1 if cfg.promotion_run > 2 else 3) if cfg.promotes_in_pairs else 1
    adds = copies
    if cfg.overlaps_store:  # the first k-block, (paired) the first pair's second
        copies, adds = copies + 1 + cfg.promotes_in_pairs, copies + 2 * cfg.promotes_in_pairs
    mma_n = 128 if block_n == 256 else block_n
    assert r.sass.count(f"QGMMA.64x{mma_n}x32.F32.E4M3.E4M3 ") == copies * 4 * block_n // mma_n, r.summary()
    assert r.count("FADD") + r.count("FFMA") == adds * block_n // 2, r.summary()
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" in r.sass
    assert not [w for w in r.warnings if "C7514" in w or "C7517" in w], r.warnings
    assert not [line for line in _k_block_loop(r.sass) if " LDG.E" in line or " LD.E " in line]
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


PER_TENSOR_DEVICE_SCALES = EpilogueConfig(row_scale=True, col_scale=True, scalar_col_scale=True)


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_m,scaling", [(128, "tensor"), (128, "rowwise"), (192, "tensor")])
def test_promoted_store_runs_behind_the_next_first_k_block(block_m, scaling):
    """Two or three consumers without block-wise scales store a tile while the next one's
    first k-block runs: in the tile loop, a wgmma group is committed and the tile's stmatrix
    stores follow before any wait for it; no spills beside the fresh accumulator, no C7514."""
    ecfg = PER_TENSOR_DEVICE_SCALES if scaling == "tensor" else EpilogueConfig(row_scale=True, col_scale=True)
    kw = dict(a_major="K", b_major="K", block_m=block_m, epilogue=ecfg, promoted=True)
    cfg = GemmConfig("e4m3", "bf16", "K", "K", block_n=128, stages=max_stages("e4m3", "bf16", 128, **kw),
                     epilogue=ecfg, promoted=True, block_m=block_m)
    assert cfg.overlaps_store
    vec = types.Array(types.float32, 1, "A")
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (vec, vec)))
    lines = [line for line in r.sass.splitlines() if "QGMMA" in line or "WARPGROUP.DEPBAR" in line or "STSM" in line]
    first_store = next(i for i, line in enumerate(lines) if "STSM" in line)
    issued = max(i for i, line in enumerate(lines[:first_store]) if "QGMMA" in line)
    assert "gsb0" in lines[issued] and not [line for line in lines[issued:first_store] if "DEPBAR" in line], \
        lines[issued:first_store]
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert not [w for w in r.warnings if "C7514" in w or "C7517" in w], r.warnings


def test_which_kernels_overlap_the_store():
    """``overlaps_store``: tiles of two consumers, or three at most 128 wide, ungrouped, without
    stream-K or ping-pong, whose output is plain 16-bit (fp8 inputs too) or whose promotion is
    unscaled, at most 128 wide, with a scale-only epilogue."""
    fp8, bf16 = ("e4m3", "bf16", "K", "K"), ("bf16", "bf16", "K", "N")
    for kw in (dict(block_n=128, promoted=True),
               dict(block_m=192, block_n=128, stages=4, promoted=True,
                    epilogue=EpilogueConfig(row_scale=True, col_scale=True)),
               dict(block_n=128)):
        assert GemmConfig(*fp8, **kw).overlaps_store, kw
    for kw in (dict(), dict(cluster_m=2, dynamic_schedule=True), dict(block_m=192, block_n=128, stages=3)):
        assert GemmConfig(*bf16, **kw).overlaps_store, kw
    for kw in (dict(block_n=128, block_scaled=True), dict(block_m=64, block_n=128, promoted=True),
               dict(block_n=192, promoted=True), dict(block_n=128, promoted=True, epilogue=EpilogueConfig(bias="col")),
               dict(block_n=128, promoted=True, stream_k=True)):
        assert not GemmConfig(*fp8, **kw).overlaps_store, kw
    assert not GemmConfig("bf16", "f32", "K", "N").overlaps_store
    for kw in (dict(epilogue=EpilogueConfig(bias="col")), dict(block_m=64, stages=5),
               dict(block_m=192, block_n=192, stages=3), dict(block_n=128, stages=4, pingpong=True),
               dict(block_n=128, stream_k=True)):
        assert not GemmConfig(*bf16, **kw).overlaps_store, kw


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_m,block_n,scaling", [(128, 192, "tensor"), (128, 256, "tensor"), (192, 128, "tensor"),
                                                     (192, 128, "rowwise")])
def test_promoted_tiles_take_per_tensor_and_row_wise_scales(block_m, block_n, scaling):
    """Per-tensor device scales are stride-0 vectors; ``scale_b``'s, a scalar column scale, joins
    each row's factor (one load per tile) instead of being staged per column, so the wide
    promoted tiles run with them. Three consumers' 192 x 128 tiles, at 160 registers each, run
    them and row-wise vectors (staged columns) too: no spills."""
    ecfg = PER_TENSOR_DEVICE_SCALES if scaling == "tensor" else EpilogueConfig(row_scale=True, col_scale=True)
    assert ecfg.column_bytes(block_n) == (0 if scaling == "tensor" else 4 * block_n)
    stages = max_stages("e4m3", "bf16", block_n, a_major="K", b_major="K", block_m=block_m, epilogue=ecfg,
                        promoted=True)
    cfg = GemmConfig("e4m3", "bf16", "K", "K", block_m=block_m, block_n=block_n, stages=stages, epilogue=ecfg,
                     promoted=True)
    vec = types.Array(types.float32, 1, "A")
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (vec, vec)))
    mma_n = 128 if block_n == 256 else block_n
    copies = 1 + cfg.overlaps_store  # (192 x 128: the first k-block's issue before the store)
    assert r.sass.count(f"QGMMA.64x{mma_n}x32.F32.E4M3.E4M3 ") == copies * 4 * block_n // mma_n, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert not [w for w in r.warnings if "C7514" in w or "C7517" in w], r.warnings


def test_per_tensor_device_scales_choose_wide_tiles():
    """Without staged column terms, per-tensor device scales may take wide tiles, and column
    vectors may not: with 192-row tiles ruled out (an fp8 output), 8192^3 and 4096x2112x7168
    take tiles over 128 wide with per-tensor device scales and 128 x 128 with a column vector."""
    vector = EpilogueConfig(row_scale=True, col_scale=True)
    fp8_out = dict(out_scale="number")
    for M, N, K in ((8192, 8192, 8192), (4096, 2112, 7168)):
        per_tensor = dataclasses.replace(PER_TENSOR_DEVICE_SCALES, **fp8_out)
        assert _choose(M, N, K, "e4m3", per_tensor, promoted=True).block_n > 128
        assert _choose(M, N, K, "e4m3", dataclasses.replace(vector, **fp8_out), promoted=True).block_n == 128
    with pytest.raises(ValueError, match="set col_scale too"):
        EpilogueConfig(scalar_col_scale=True)


def test_a_stride_0_col_scale_is_a_scalar():
    """What ``Fusion.config`` compiles a column scale as: a scalar when it has stride 0 or one
    column, else a staged vector (also in the swapped kernel, where ``row_scale`` becomes it)."""
    from numba_hopper.matmul.fusion import Fusion
    from numba_hopper.runtime.arrays import DeviceView

    def vec(n, stride):
        return DeviceView(0x7F0000000000, (n,), (stride,), "f32", 4, 0, "torch")

    assert Fusion({"col_scale": vec(N, 0)}).config(False).scalar_col_scale
    assert Fusion({"col_scale": vec(1, 1)}).config(False).scalar_col_scale
    assert not Fusion({"col_scale": vec(N, 1)}).config(False).scalar_col_scale
    swapped = Fusion({"row_scale": vec(M, 1), "col_scale": vec(N, 0)}).transposed().config(True)
    assert swapped.col_scale and not swapped.scalar_col_scale and swapped.row_scale


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_m,block_n", [(128, 128), (64, 128)])
def test_block_wise_tiles_promote_in_pairs_only_in_plain_products(block_m, block_n):
    """Paired k-blocks with an fp8 output compile without spills; a fused epilogue whose terms
    would spill beside the second accumulator (all of them: 156 bytes) keeps one."""
    plain = EpilogueConfig(alpha=True)
    cfg = GemmConfig("e4m3", "e4m3", "K", "K", block_m=block_m, block_n=block_n, epilogue=plain, block_scaled=True,
                     stages=max_stages("e4m3", "e4m3", block_n, a_major="K", b_major="K", block_m=block_m,
                                       epilogue=plain, block_scaled=True))
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (types.float32,)))
    assert cfg.promotes_in_pairs and r.count("QGMMA") == 12, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    fused = EpilogueConfig(c_dtype="bf16", row_scale=True, bias="col", bias_dtype="bf16",
                           activation="gelu_tanh", out_scale="array", amax=True)
    assert not dataclasses.replace(cfg, epilogue=fused).promotes_in_pairs
    assert not dataclasses.replace(cfg, epilogue=EpilogueConfig(bias="col")).promotes_in_pairs


def test_bmm_refuses_fp8():
    with pytest.raises(DtypeError, match="bmm does not take fp8"):
        g.bmm(_a(), _b(), dtype="e4m3")


def _ptr(x):
    return x.__cuda_array_interface__["data"][0]


def test_scaled_calls_bind_each_calls_scales(monkeypatch):
    """Calls whose only epilogue keywords are the scales take a fast path after their layout's
    first call: each call's numbers and arrays land where the first call's plan reads them."""
    from numba_hopper.matmul.plan import VALUE_INDEX

    A_BLOCK_SCALES, ALPHA, B_BLOCK_SCALES, COL_SCALE, ROW_SCALE = (
        VALUE_INDEX[name] for name in ("a_block_scales", "alpha", "b_block_scales", "col_scale", "row_scale"))

    seen, firsts = [], []

    class Plan:
        def __call__(self, stream, values, graph=None):
            seen.append(list(values))

    def first(key, a, b, out, f, fvalues, *rest):
        firsts.append(key)
        entry = plan_cache.Entry(Plan(), (), None, a)
        plan_cache.remember(key, entry)
        entry.plan(0, [0, 0, 0, 0, *fvalues])
        return out

    monkeypatch.setattr(g, "_first_gemm", first)
    g.clear_plans()
    a, b, out = _a(k=KB), _b(k=KB), FakeCAI((M, N), "<f4", ptr=next(_addresses))

    def call(sa, sb):
        _call(a, b, out=out, scale_a=sa, scale_b=sb)
        return seen[-1]

    blocks = [(_block((M, 2)), _block((2, 1))) for _ in range(3)]
    for sa, sb in blocks:
        v = call(sa, sb)
        assert (v[A_BLOCK_SCALES], v[B_BLOCK_SCALES]) == (_ptr(sa), _ptr(sb))
        assert v[ALPHA] == 1.0 and v[ROW_SCALE] == v[COL_SCALE] == 0
    for _ in range(2):
        ra, rb = _v(M), _v(N)
        v = call(ra, rb)
        assert (v[ROW_SCALE], v[COL_SCALE], v[A_BLOCK_SCALES]) == (_ptr(ra), _ptr(rb), 0)
    for x, y in ((2.0, 3.0), (0.5, 8.0), (1.5, 1.0)):
        assert call(x, y)[ALPHA] == x * y
    v = call(0.5, _v(N))  # a number and a vector
    assert v[ALPHA] == 0.5 and v[COL_SCALE] != 0
    # one first call per layout: block-wise, row-wise, numbers (their product is not 1: one
    # kernel with alpha), a number with a vector
    assert len(firsts) == 4, firsts


@pytest.mark.parametrize("ecfg,scales", [(PER_TENSOR_DEVICE_SCALES, "vectors"), (EpilogueConfig(row_scale=True, col_scale=True), "vectors"),
                                         (None, None)], ids=["tensor", "rowwise", "plain"])
def test_unpromoted_ping_pong_tiles_compile_without_spills(ecfg, scales):
    """A ping-pong consumer issues both 64-row halves of a 128 x 128 fp8 tile (8 wgmmas a k-block)
    and stores both with its scales."""
    kw = dict(a_major="K", b_major="K", block_n=128, pingpong=True, epilogue=ecfg)
    cfg = GemmConfig("e4m3", "bf16", stages=max_stages("e4m3", "bf16", **kw), **kw)
    vec = types.Array(types.float32, 1, "A")
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (vec, vec) if scales else None))
    assert r.sass.count("QGMMA.64x128x32.F32.E4M3.E4M3 ") == 8, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


@pytest.mark.parametrize("M,N,K,pingpong", [
    # measured faster in 128 x 128 ping-pong tiles than in the cooperative default (use_fast_accum=True)
    (4096, 4096, 4096, True), (8192, 8192, 8192, True), (4096, 7168, 2048, True), (4096, 24576, 1536, True),
    (4096, 4096, 7168, True), (4096, 7168, 16384, True),
    # measured slower: 4.1 waves of 128-wide tiles against 2.7 of 192-wide ones; under two tiles a CTA; 64-row tiles
    (4096, 2112, 7168, False), (1024, 4096, 4096, False), (128, 7168, 16384, False),
])
def test_unpromoted_fp8_products_take_ping_pong_tiles_where_they_pay(M, N, K, pingpong):
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    a, b, out = _view(M, K, "e4m3", True), _view(K, N, "e4m3", False), _view(M, N, "bf16", True)
    for ecfg in (PER_TENSOR_DEVICE_SCALES, EpilogueConfig(row_scale=True, col_scale=True), None):
        fast = choose_config(a, b, out, None, False, epilogue=ecfg, limits=H100)
        assert fast.pingpong == pingpong and (not pingpong or (fast.block_m, fast.block_n) == (128, 128)), fast
        assert not choose_config(a, b, out, None, False, epilogue=ecfg, promoted=True, limits=H100).pingpong
    with_c = EpilogueConfig(c_dtype="bf16")
    assert not choose_config(a, b, out, None, False, epilogue=with_c, limits=H100).pingpong
