"""numba_hopper.gemm on the H100 against a float64 reference, outputs poisoned with NaN."""

import numpy as np
import pytest

from numba_hopper import GemmConfig, gemm

pytestmark = pytest.mark.gpu

TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
# bf16/fp16 outputs round to 8/11 bits; fp32 outputs only see fp32 accumulation order.
TOL = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-4}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _operand(torch, rows, cols, dtype, major, gen):
    """A random (rows, cols) tensor, row-major ("R") or column-major ("C")."""
    tdt = getattr(torch, TORCH_DTYPES[dtype])
    if major == "R":
        return torch.randn(rows, cols, generator=gen, device="cuda").to(tdt)
    return torch.randn(cols, rows, generator=gen, device="cuda").to(tdt).t()


def _check(torch, M, N, K, dtype="bf16", out_dtype="bf16", layout="RR", out_major="R", config=None):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(np.random.SeedSequence().entropy % 2**63)
    a = _operand(torch, M, K, dtype, layout[0], gen)
    b = _operand(torch, K, N, dtype, layout[1], gen)
    out = _operand(torch, M, N, out_dtype, out_major, gen)
    out.fill_(float("nan"))
    res = gemm(a, b, out=out, config=config)
    assert res is out
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    err = (out.double() - ref).norm() / max(ref.norm().item(), 1e-30)
    assert torch.isfinite(out).all(), "unwritten (NaN) output elements"
    assert err.item() < TOL[out_dtype], (M, N, K, dtype, out_dtype, layout, err.item())


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 7, 7), (64, 64, 64), (129, 129, 129), (1000, 1000, 1000),
                                   (1, 300, 77), (300, 1, 129), (129, 513, 64), (200, 264, 1)])
@pytest.mark.parametrize("layout", ["RR", "RC", "CR", "CC"])
def test_ragged_sizes_all_layouts(torch, M, N, K, layout):
    _check(torch, M, N, K, layout=layout)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("layout", ["RR", "CC"])
def test_dtypes(torch, dtype, out_dtype, layout):
    _check(torch, 333, 520, 270, dtype, out_dtype, layout)


@pytest.mark.parametrize("block_n", [64, 112, 128, 144, 160, 192, 224])
@pytest.mark.parametrize("M,N,K,layout", [(333, 520, 270, "RR"), (1000, 7, 300, "CC"), (129, 1000, 1000, "RC"),
                                          (1792, 1280, 640, "CR")])
def test_tile_widths(torch, block_n, M, N, K, layout):
    """Every tile width the heuristic may pick, ragged and with several tiles per CTA."""
    _check(torch, M, N, K, layout=layout, config=GemmConfig(block_n=block_n, stages=4))
    _check(torch, M, N, K, layout=layout, out_dtype="f32", config=GemmConfig(block_n=block_n, stages=4))


@pytest.mark.parametrize("block_n", [32, 64, 128])
@pytest.mark.parametrize("M,N,K,layout", [(1, 1, 1, "RR"), (7, 1000, 300, "CC"), (64, 4096, 640, "RR"),
                                          (129, 129, 129, "RC"), (333, 520, 270, "CR")])
def test_64_row_tiles(torch, block_n, M, N, K, layout):
    """One consumer warpgroup per 64-row tile, a deep ring (wrapping several times), ragged
    edges and several tiles per CTA; 32-wide tiles read an N-major B in 64-byte swizzled boxes."""
    _check(torch, M, N, K, layout=layout, config=GemmConfig(block_m=64, block_n=block_n, stages=6))
    _check(torch, M, N, K, layout=layout, out_dtype="f32", config=GemmConfig(block_m=64, block_n=block_n, stages=6))


@pytest.mark.parametrize("layout", ["RR", "RC", "CR", "CC"])
@pytest.mark.parametrize("M,N,K", [(128, 4608, 3584), (112, 4480, 3072)])
def test_rows_together_at_small_m(torch, M, N, K, layout):
    """M = 112-128 with a wave of at most 80 64 x 128 tiles and A's rows on 128-byte lines: the
    default runs 128 x 64 tiles (112 rows: A's column-major rows straddle, so not with CR or CC)."""
    from numba_hopper.runtime.arrays import device_view
    from numba_hopper.matmul.heuristics import choose_config

    a = _operand(torch, M, K, "bf16", layout[0], None)
    b = _operand(torch, K, N, "bf16", layout[1], None)
    cfg = choose_config(device_view(a), device_view(b), device_view(torch.empty(M, N, device="cuda",
                                                                                  dtype=torch.bfloat16)), None, False)
    assert (cfg.block_m, cfg.block_n) == ((128, 64) if layout[0] == "R" or M % 64 == 0 else (64, 128))
    _check(torch, M, N, K, layout=layout)


@pytest.mark.parametrize("block_n", [128, 176])
@pytest.mark.parametrize("M,N,K,layout", [(1, 1, 1, "RC"), (300, 7, 129, "RR"), (129, 1000, 64, "RC"),
                                          (1000, 1000, 1000, "CR"), (1792, 5000, 640, "CC"), (4096, 2304, 2048, "RC")])
def test_ping_pong_consumers(torch, block_n, M, N, K, layout):
    """Ping-pong consumers taking whole tiles in turn: one tile (the second consumer idle), CTAs
    with odd and even tile counts (4096 x 2304: 4 or 5 tiles a CTA), tiles of one k-block (each
    consumer passes over the other's one slot) and longer than the ring, ragged edges, every
    layout (a column-major A's halves are its two 64-row boxes), 16- and 32-bit outputs."""
    cfg = GemmConfig(block_n=block_n, pingpong=True, stages=4)  # (a row-major B's 176 columns load 192)
    _check(torch, M, N, K, layout=layout, config=cfg)
    _check(torch, M, N, K, layout=layout, out_dtype="f32", config=cfg)


def test_ping_pong_batches(torch):
    from numba_hopper import bmm

    a = torch.randn(3, 700, 520, device="cuda").to(torch.bfloat16)
    b = torch.randn(3, 520, 904, device="cuda").to(torch.bfloat16)
    out = torch.full((3, 700, 904), float("nan"), device="cuda", dtype=torch.bfloat16)
    bmm(a, b, out=out, config=GemmConfig(block_n=128, pingpong=True, stages=5))
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL["bf16"]


@pytest.mark.parametrize("M,N,K", [(7, 129, 64), (1000, 1000, 1000), (4096, 2304, 512)], ids=str)
def test_ping_pong_fused_epilogues(torch, M, N, K):
    """Ping-pong consumers run the fused epilogue on both halves of their tiles: alpha, a column
    bias, silu and the pre-activation ``aux_out``; a row bias and relu."""
    import torch.nn.functional as F

    cfg = GemmConfig(block_n=128, pingpong=True, stages=5)
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    w = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    bias, row_bias = torch.randn(N, device="cuda").to(torch.bfloat16), torch.randn(M, device="cuda")
    ref = a.double() @ w.double().t()
    pre = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = gemm(a, w.t(), alpha=0.5, bias=bias, activation="silu", aux_out=pre, config=cfg)
    relu = gemm(a, w.t(), bias=row_bias, bias_dim=0, activation="relu", config=cfg)
    pre_ref = 0.5 * ref + bias.double()
    for got, want in ((pre, pre_ref), (out, F.silu(pre_ref)), (relu, torch.relu(ref + row_bias.double()[:, None]))):
        assert torch.isfinite(got).all()
        assert ((got.double() - want).norm() / want.norm()).item() < TOL["bf16"]


# One kernel per case (each compile takes seconds): the widths, layouts and output dtypes spread.
@pytest.mark.parametrize("block_n,layout,out_dtype", [(192, "RR", "bf16"), (192, "CC", "f32"), (128, "RC", "bf16"),
                                                      (128, "CR", "f32"), (64, "RC", "bf16")])
def test_192_row_tiles(torch, block_n, layout, out_dtype):
    """Three consumer warpgroups per 192-row tile: ragged edges in each of them, several tiles
    per CTA."""
    cfg = GemmConfig(block_m=192, block_n=block_n, stages=3)
    for M, N, K in [(1, 1, 1), (7, 1000, 300), (193, 129, 129), (1000, 520, 270), (4100, 600, 640)]:
        _check(torch, M, N, K, layout=layout, out_dtype=out_dtype, config=cfg)


@pytest.mark.parametrize("cluster,block_n,layout", [((2, 1), 192, "RC"), ((1, 2), 192, "RR"), ((2, 1), 128, "RR"),
                                                    ((2, 2), 128, "RC")], ids=str)
@pytest.mark.parametrize("M,N,K", [(1000, 1000, 1000), (4096, 5632, 256)])
def test_192_row_tiles_in_clusters(torch, cluster, block_n, layout, M, N, K):
    # (built with the majors of the layout: a 2x1 cluster of 192-wide tiles splits a K-major B only)
    cfg = GemmConfig(a_major="K", b_major="N" if layout[1] == "R" else "K", block_m=192, block_n=block_n, stages=3,
                     cluster_m=cluster[0], cluster_n=cluster[1])
    _check(torch, M, N, K, layout=layout, config=cfg)


@pytest.mark.parametrize("cfg,layout,out_dtype", [
    (GemmConfig(a_major="M", block_m=256, block_n=128, cluster_n=2), "CR", "bf16"),
    (GemmConfig(b_major="K", block_m=256, block_n=128, cluster_n=2), "RC", "f32"),
    (GemmConfig(a_major="M", b_major="K", block_m=256, block_n=128, stages=3, cluster_m=2), "CC", "bf16"),
    (GemmConfig(block_m=256, block_n=64, stages=4), "RR", "bf16"),
    (GemmConfig(a_major="M", block_m=256, block_n=128, cluster_n=2, dynamic_schedule=True), "CR", "bf16")],
    ids=["CR-1x2", "RC-1x2-f32", "CC-2x1", "RR-64", "CR-1x2-dynamic"])
def test_256_row_tiles(torch, cfg, layout, out_dtype):
    """Two consumers of 128 rows per 256-row tile: ragged edges in each of their four 64-row
    blocks, clusters with a CTA left without a tile, several tiles per CTA."""
    for M, N, K in [(1, 1, 8), (7, 1000, 296), (257, 129, 136), (1000, 520, 264), (4104, 2600, 1000)]:
        _check(torch, M, N, K, layout=layout, out_dtype=out_dtype, config=cfg)


def test_256_row_tiles_fused_epilogue(torch):
    """Both of a consumer's 64-row blocks run the fused epilogue: alpha, a column bias, silu and
    the pre-activation ``aux_out``."""
    import torch.nn.functional as F

    cfg = GemmConfig(b_major="K", block_m=256, block_n=128, stages=4)
    a = torch.randn(1000, 520, device="cuda").to(torch.bfloat16)
    w = torch.randn(700, 520, device="cuda").to(torch.bfloat16)
    bias = torch.randn(700, device="cuda").to(torch.bfloat16)
    pre = torch.full((1000, 700), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = gemm(a, w.t(), alpha=0.5, bias=bias, activation="silu", aux_out=pre, config=cfg)
    pre_ref = 0.5 * (a.double() @ w.double().t()) + bias.double()
    for got, want in ((pre, pre_ref), (out, F.silu(pre_ref))):
        assert torch.isfinite(got).all()
        assert ((got.double() - want).norm() / want.norm()).item() < TOL["bf16"]


@pytest.mark.parametrize("cfg,layout", [
    (GemmConfig(b_major="K", a_evict="last", b_evict="first"), "RC"),
    (GemmConfig(a_major="M", cluster_m=2, a_evict="first", b_evict="last"), "CR"),
    (GemmConfig(b_major="K", block_n=128, cluster_n=2, a_evict="last"), "RC")], ids=["RC", "CR-2x1", "RC-1x2"])
def test_l2_priorities(torch, cfg, layout):
    """Loads with L2 cache hints (plain and multicast) fill the same tiles."""
    for M, N, K in [(1, 1, 8), (7, 1000, 296), (129, 127, 136), (1000, 520, 264), (4104, 2600, 1000)]:
        _check(torch, M, N, K, layout=layout, config=cfg)


@pytest.mark.parametrize("cfg,layout", [
    (GemmConfig(a_major="M", cluster_m=2, dynamic_schedule=True), "CR"),
    (GemmConfig(b_major="K", dynamic_schedule=True), "RC"),
    (GemmConfig(b_major="K", block_n=128, cluster_n=2, dynamic_schedule=True), "RC")], ids=["CR-2x1", "RC", "RC-1x2"])
def test_dynamic_schedule(torch, cfg, layout):
    """Tiles taken off the counter, each exactly once (the output poisoned): ragged edges, fewer
    tiles than clusters, tens of tiles per cluster, launch after launch (each leaves the counter
    at zero for the next), and batches."""
    from numba_hopper import bmm

    for M, N, K in [(1, 1, 8), (7, 1000, 296), (129, 127, 136), (1000, 520, 264), (8200, 6000, 136), (4104, 2600, 1000)]:
        _check(torch, M, N, K, layout=layout, config=cfg)
    a = torch.randn(3, 700, 520, device="cuda").to(torch.bfloat16)
    b = torch.randn(3, 520, 904, device="cuda").to(torch.bfloat16)
    if cfg.a_major == "M":
        a = a.transpose(1, 2).contiguous().transpose(1, 2)
    if cfg.b_major == "K":
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    out = torch.full((3, 700, 904), float("nan"), device="cuda", dtype=torch.bfloat16)
    bmm(a, b, out=out, config=cfg)
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL["bf16"]


@pytest.mark.parametrize("cfg,layout,out_dtype", [
    (GemmConfig(block_m=192, block_n=192, stages=4, cluster_n=2, epi_buffers=1), "RR", "bf16"),
    (GemmConfig(a_major="M", b_major="K", block_m=192, block_n=192, stages=4, cluster_m=2, epi_buffers=1), "CC", "bf16"),
    (GemmConfig(b_major="K", block_n=256, stages=4, epi_buffers=1), "RC", "f32")],
    ids=["192x192-1x2-RR", "192x192-2x1-CC", "128x256-RC-f32"])
def test_one_output_buffer_per_consumer(torch, cfg, layout, out_dtype):
    """Each sub-tile waits for the store before it to read the consumer's one buffer: several
    sub-tiles and tiles per consumer, ragged edges, clusters with a CTA left without a tile.
    (K and the larger M are multiples of 8, so column-major operands stay TMA-addressable: a
    copy would make them row-major, which a 2x1 cluster of 192-wide tiles does not split.)"""
    for M, N, K in [(1, 300, 80), (7, 1000, 296), (193, 129, 136), (1000, 520, 264), (4104, 600, 640)]:
        _check(torch, M, N, K, layout=layout, out_dtype=out_dtype, config=cfg)


@pytest.mark.parametrize("block_n", [64, 128, 192])
@pytest.mark.parametrize("M,N,K,layout", [
    (1792, 1280, 640, "CR"),  # fewer tiles than SMs: runs shorter than a tile, chains of 2-3 CTAs
    (333, 520, 1000, "RC"),  # few tiles, 4 k-blocks a CTA: chains of up to 5 CTAs
    (2304, 1280, 777, "RR"),  # data-parallel waves, then stream-K over the last full and partial wave
    (64, 4096, 4096, "RR"),
    (300, 300, 129, "CC"),  # 3 k-blocks a tile: runs of whole tiles and pieces
])
def test_stream_k(torch, block_n, M, N, K, layout):
    _check(torch, M, N, K, layout=layout, out_dtype="f32", config=GemmConfig(block_n=block_n, stages=4, stream_k=True))


def test_stream_k_is_deterministic_and_leaves_its_flags_clear(torch):
    """Bitwise-equal results on every call (cached plan, same workspace) and on a second stream."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    a = torch.randn(333, 1000, generator=gen, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, 520, generator=gen, device="cuda").to(torch.bfloat16)
    cfg = GemmConfig(block_n=64, stages=4, stream_k=True)
    outs = []
    for stream in (None, None, None, torch.cuda.Stream()):
        out = torch.full((333, 520), float("nan"), device="cuda", dtype=torch.float32)
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            gemm(a, b, out=out, config=cfg)
        torch.cuda.synchronize()
        outs.append(out)
    ref = a.double() @ b.double()
    assert ((outs[0].double() - ref).norm() / ref.norm()).item() < 1e-4
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("M,N,K", [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 512),
                                   (1792, 1280, 4096), (1920, 1280, 4096), (1000, 1000, 1000),
                                   (4096, 4096, 4096)])
def test_suite_shapes(torch, M, N, K):
    _check(torch, M, N, K)


def test_persistent_ctas_take_many_tiles(torch):
    # 4096 x 4096 in 128 x 256 tiles is 512 tiles on <= 132 CTAs: every CTA runs >= 3 tiles
    # and its ring state crosses tile boundaries with k-block counts (13) not a multiple of
    # the stage count.
    _check(torch, 4096, 4096, 13 * 64 - 5, layout="RC")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("M,N,K,layout", [(1, 3584, 3584, "RC"), (8, 2048, 2048, "RC"), (9, 2048, 5632, "RR"),
                                          (16, 4096, 4096, "RC"), (7, 136, 1000, "RR"), (8, 1000, 64, "RC")])
def test_decode_products_run_swapped(torch, dtype, M, N, K, layout):
    """A few rows run swapped, the tokens on wgmma's narrow N, the output stored transposed."""
    from numba_hopper.runtime.arrays import device_view
    from numba_hopper.matmul.heuristics import narrow_config
    from numba_hopper.runtime.launch import device_limits

    a = _operand(torch, M, K, dtype, "R", torch.Generator(device="cuda"))
    b = _operand(torch, K, N, dtype, layout[1], torch.Generator(device="cuda"))
    views = [device_view(x) for x in (a, b, torch.empty(M, N, device="cuda", dtype=a.dtype))]
    assert narrow_config(*views, device_limits(0)) is not None
    _check(torch, M, N, K, dtype, dtype, layout)
    ref = a.double() @ b.double()
    fresh = gemm(a, b)
    assert fresh.shape == (M, N) and fresh.is_contiguous()
    assert ((fresh.double() - ref).norm() / ref.norm()).item() < TOL[dtype]


@pytest.mark.parametrize("cfg,layout,out_dtype", [
    (GemmConfig(block_m=64, block_n=64, stages=8, acc_chains=4), "RR", "bf16"),
    (GemmConfig(block_m=64, block_n=64, stages=8, acc_chains=4), "CC", "f32"),
    (GemmConfig(block_m=64, block_n=32, stages=8, acc_chains=4), "RC", "bf16"),
    (GemmConfig(block_n=64, stages=8, acc_chains=4), "CR", "f32")],
    ids=lambda v: f"{v.block_m}x{v.block_n}" if isinstance(v, GemmConfig) else str(v))
def test_separate_accumulators(torch, cfg, layout, out_dtype):
    """One accumulator per wgmma of a k-block, summed after the K loop: K shorter than a
    k-step, ragged K, several tiles per CTA."""
    for M, N, K in [(1, 1, 1), (7, 1000, 300), (129, 129, 129), (300, 520, 1000), (64, 4096, 4096)]:
        _check(torch, M, N, K, layout=layout, out_dtype=out_dtype, config=cfg)


@pytest.mark.parametrize("M,N,K", [(8, 2048, 2048), (16, 4096, 4096), (7, 136, 1000), (1, 200, 9)])
def test_swapped_decode_products_with_separate_accumulators(torch, M, N, K):
    """A config with out_major = "M" runs the product swapped, as the heuristic's decode kernels do."""
    cfg = GemmConfig(block_m=64, block_n=8 if M <= 8 else 16, b_major="K", out_major="M", stages=8, acc_chains=4)
    _check(torch, M, N, K, layout="RC", config=cfg)
    if M > 1:  # (a 1 x K view is row-major too)
        with pytest.raises(ValueError, match="swapped"):  # the tokens column-major
            _check(torch, M, N, K, layout="CC", config=cfg)


@pytest.mark.parametrize("out_major", ["C"])
@pytest.mark.parametrize("layout", ["RR", "CR"])
def test_column_major_output(torch, layout, out_major):
    _check(torch, 257, 190, 300, layout=layout, out_major=out_major, out_dtype="f32")


def test_misaligned_operands_take_the_copy_path(torch):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    base = torch.randn(301, 1003, generator=gen, device="cuda").to(torch.bfloat16)
    a = base[1:, 3:]  # odd offset and a leading dimension of 1003 elements (not 16-byte)
    b = torch.randn(1000, 136, generator=gen, device="cuda").to(torch.bfloat16)
    out = gemm(a, b, out_dtype="f32")
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4


def test_allocates_output_of_callers_kind(torch):
    a = torch.randn(70, 40, device="cuda", dtype=torch.float16)
    b = torch.randn(40, 90, device="cuda", dtype=torch.float16)
    out = gemm(a, b)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16 and out.shape == (70, 90)
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_numba_bf16_as_uint16():
    from numba import cuda

    from _ref import bf16_bits_to_f64, f32_to_bf16_bits

    rng = np.random.default_rng()
    a = f32_to_bf16_bits(rng.standard_normal((150, 96), dtype=np.float32))
    b = f32_to_bf16_bits(rng.standard_normal((96, 210), dtype=np.float32))
    out = gemm(cuda.to_device(a), cuda.to_device(b), dtype="bf16", out_dtype="f32")
    ref = bf16_bits_to_f64(a) @ bf16_bits_to_f64(b)
    got = out.copy_to_host()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
    out16 = gemm(cuda.to_device(a), cuda.to_device(b), dtype="bf16").copy_to_host()
    assert out16.dtype == np.uint16
    assert np.linalg.norm(bf16_bits_to_f64(out16) - ref) / np.linalg.norm(ref) < 1e-2


def test_empty_and_k0(torch):
    a = torch.randn(5, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(0, 7, device="cuda", dtype=torch.bfloat16)
    out = torch.full((5, 7), float("nan"), device="cuda", dtype=torch.float32)
    gemm(a, b, out=out)
    assert (out == 0).all()
    e = gemm(torch.randn(0, 8, device="cuda", dtype=torch.bfloat16), torch.randn(8, 3, device="cuda", dtype=torch.bfloat16))
    assert e.shape == (0, 3)



def test_cached_plan_sees_new_data(torch):
    # The second call on the same buffers reuses the cached plan (descriptors, launch).
    a = torch.empty(300, 200, device="cuda", dtype=torch.bfloat16)
    b = torch.empty(200, 136, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(300, 136, device="cuda", dtype=torch.float32)
    for _ in range(2):
        a.normal_()
        b.normal_()
        out.fill_(float("nan"))
        gemm(a, b, out=out)
        ref = a.double() @ b.double()
        assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4


def test_strided_output_view_goes_through_scratch(torch):
    a = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 50, device="cuda", dtype=torch.bfloat16)
    big = torch.full((200, 100), float("nan"), device="cuda", dtype=torch.float32)
    out = big[::2, ::2]  # strides (200, 2): neither row- nor column-major
    gemm(a, b, out=out)
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4
    assert torch.isnan(big[1::2]).all() and torch.isnan(big[::2, 1::2]).all()  # nothing else written


CLUSTERS = [(2, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: f"cluster{c[0]}x{c[1]}")
@pytest.mark.parametrize("layout", ["RR", "RC", "CR", "CC"])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (129, 300, 77), (1000, 1000, 1000), (300, 520, 200)])
def test_clusters_with_multicast(torch, cluster, layout, M, N, K):
    # Odd tile counts leave a cluster CTA with no tile of its own: it must still load its
    # share of the peer's operand (zero-filled for itself) and store nothing.
    from numba_hopper import GemmConfig

    cfg = GemmConfig(cluster_m=cluster[0], cluster_n=cluster[1])
    gen = torch.Generator(device="cuda")
    gen.manual_seed(np.random.SeedSequence().entropy % 2**63)
    a = _operand(torch, M, K, "bf16", layout[0], gen)
    b = _operand(torch, K, N, "bf16", layout[1], gen)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
    gemm(a, b, out=out, config=cfg)
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4


@pytest.mark.parametrize("layout,M,N,K,tile", [
    # rows of 1000 or 520 bf16 (2000 or 1040 bytes: 16 mod 32) in both operands: 2x2 clusters
    *((layout, 520, 1000, 1000, (128, 2, 2)) for layout in ("RR", "RC", "CR", "CC")),
    # in B alone (A's rows of 1024 or 640 bf16 are aligned): 2x1 clusters sharing B
    ("RR", 640, 1000, 1024, (128, 2, 1)), ("CR", 640, 1000, 1024, (128, 2, 1)), ("CC", 640, 1000, 1000, (128, 2, 1)),
    # in both, with enough tiles: 192 x 192 tiles in 1x2 (2x1 with a column-major A) clusters
    ("RR", 3000, 3000, 3000, (192, 1, 2)), ("CC", 3000, 3000, 3000, (192, 2, 1))])
def test_rows_straddling_sectors_run_in_clusters(torch, layout, M, N, K, tile):
    # 5 x 8 tiles leave the last cluster row with one CTA that has no tile of its own.
    from numba_hopper.runtime.arrays import device_view
    from numba_hopper.matmul.heuristics import choose_config

    gen = torch.Generator(device="cuda")
    gen.manual_seed(np.random.SeedSequence().entropy % 2**63)
    a = _operand(torch, M, K, "bf16", layout[0], gen)
    b = _operand(torch, K, N, "bf16", layout[1], gen)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = choose_config(device_view(a), device_view(b), device_view(out), None, False)
    assert (cfg.block_n, cfg.cluster_m, cfg.cluster_n) == tile
    gemm(a, b, out=out)
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: f"cluster{c[0]}x{c[1]}")
def test_clusters_persistent_many_tiles(torch, cluster):
    from numba_hopper import GemmConfig

    a = torch.randn(4096 + 64, 13 * 64 - 5, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(13 * 64 - 5, 4096 + 200, device="cuda", dtype=torch.bfloat16)
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out, config=GemmConfig(cluster_m=cluster[0], cluster_n=cluster[1]))
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
