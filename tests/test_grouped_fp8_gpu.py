"""FP8 grouped GEMM on the H100: block-wise scaled groups (DeepSeek-V3's recipe) against float64
of the dequantized operands, group by group; the rows it must not write (NaN-poisoned outputs);
empty and skewed groups, partial tiles and a partial last k-block; every tile; per-tensor
numbers; numba arrays; CUDA-graph replays with new sizes and scales; torch._scaled_mm per group.

Tolerances are gemm's (tests/test_fp8_gpu.py): every product promotes the fp8 accumulator every
128 K by default, so ``tolerance`` (the output rounding + 3e-4) holds whatever K; with
``use_fast_accum=True`` the bound grows with K (``tolerance(out_dtype, K, fast=True)``). Every failure message names
the group and prints the measured error.
"""

import itertools

import pytest
from numba import cuda

from numba_hopper import GemmConfig, grouped_gemm
from test_fp8_gpu import FP8, TORCH_OUT, _block_reference, _rel, contrast_column_blocks, tolerance
from test_grouped_gpu import SIZES

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8 dtypes")
    return torch


def _gen(torch, seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def _fp8(torch, x, fp8):
    return x.to(getattr(torch, FP8[fp8]))


def _weights(torch, G, N, K, fp8="e4m3", seed=1):
    """b (G, K, N): a contiguous (G, N, K) fp8 weight's transpose(1, 2) (each b[g] K-major)."""
    return _fp8(torch, torch.randn(G, N, K, generator=_gen(torch, seed), device="cuda") * 0.5, fp8).transpose(1, 2)


def _scale(torch, shape, layout, seed):
    """Positive float32 scales of ``shape`` whose last two dimensions are (rows, columns):
    row-major ("rows"), or each matrix column-major ("torch": torch._scaled_mm's strides)."""
    gen = _gen(torch, seed)
    if layout == "rows":
        return torch.rand(*shape, generator=gen, device="cuda") + 0.5
    flipped = (*shape[:-2], shape[-1], shape[-2])
    return (torch.rand(*flipped, generator=gen, device="cuda") + 0.5).transpose(-1, -2)


def _blocks(n):
    return -(-n // 128)


def _contiguous(torch, sizes, N, K, fp8="e4m3", layout="torch", extra=37, seed=0):
    """``(a, b, offsets, scale_a, scale_b)``: ``extra`` rows of a past the last group."""
    rows, G = sum(sizes) + extra, len(sizes)
    a = _fp8(torch, torch.randn(rows, K, generator=_gen(torch, seed), device="cuda") * 2, fp8)
    offsets = torch.tensor(list(itertools.accumulate(sizes)), device="cuda", dtype=torch.int32)
    return (a, _weights(torch, G, N, K, fp8, seed + 1), offsets,
            _scale(torch, (rows, _blocks(K)), layout, seed + 2), _scale(torch, (G, _blocks(K), _blocks(N)), layout,
                                                                        seed + 3))


def _masked(torch, counts, M, N, K, fp8="e4m3", layout="torch", seed=0):
    """``(a, b, masked_m, scale_a, scale_b)``."""
    G = len(counts)
    a = _fp8(torch, torch.randn(G, M, K, generator=_gen(torch, seed), device="cuda") * 2, fp8)
    masked_m = torch.tensor(counts, device="cuda", dtype=torch.int32)
    return (a, _weights(torch, G, N, K, fp8, seed + 1), masked_m,
            _scale(torch, (G, M, _blocks(K)), layout, seed + 2), _scale(torch, (G, _blocks(K), _blocks(N)), layout,
                                                                        seed + 3))


def _nan_out(torch, shape, out_dtype="bf16"):
    return torch.full(shape, float("nan"), device="cuda", dtype=getattr(torch, TORCH_OUT[out_dtype]))


def _check_group(torch, got, ref, tol, what):
    assert not torch.isnan(got).any(), f"{what}: rows of the group left unwritten (NaN)"
    err = _rel(torch, got, ref)
    assert err < tol, f"{what}: relative error {err:.3g} >= {tol:.3g}"


def _check_contiguous(torch, out, a, b, sizes, sa, sb, out_dtype="bf16", post=None):
    """Each group against float64 of its dequantized rows and b[g] (``post``: the fused
    epilogue on the reference, given the group's row slice); rows past the last group NaN."""
    start = 0
    for g, n in enumerate(sizes):
        if n:
            rows = slice(start, start + n)
            ref = _block_reference(torch, a[rows], b[g], sa[rows], sb[g])
            if post is not None:
                ref = post(ref, rows)
            _check_group(torch, out[rows], ref, tolerance(out_dtype), f"group {g} ({n} rows)")
        start += n
    assert torch.isnan(out[start:]).all(), "rows past offsets[-1] were written"


def _check_masked(torch, out, a, b, counts, sa, sb, out_dtype="bf16"):
    for g, m in enumerate(counts):
        if m:
            ref = _block_reference(torch, a[g, :m], b[g], sa[g, :m], sb[g])
            _check_group(torch, out[g, :m], ref, tolerance(out_dtype), f"group {g} ({m} rows)")
        assert torch.isnan(out[g, m:]).all(), f"group {g}: rows at or past masked_m[g] = {m} were written"


@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("layout", ["torch", "rows"])
def test_contiguous_block_wise(torch, sizes, layout):
    N, K = 320, 656  # a partial column tile and scale block; 5 k-blocks and a 16-deep sixth
    a, b, offsets, sa, sb = _contiguous(torch, sizes, N, K, layout=layout)
    out = _nan_out(torch, (a.shape[0], N))
    assert grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb) is out
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, sa, sb)


# Every tile a block-wise product runs on (192-wide ones when asked for), with both output widths.
@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 64), (64, 128), (64, 64), (128, 192), (64, 192)])
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_contiguous_block_wise_tiles(torch, block_m, block_n, out_dtype):
    sizes = [0, 1, 7, 129, 1000, 65, 63]
    N, K = 1000, 2048 + 80
    a, b, offsets, sa, sb = _contiguous(torch, sizes, N, K, layout="rows")
    out = _nan_out(torch, (a.shape[0], N), out_dtype)
    grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb, config=GemmConfig(block_m=block_m, block_n=block_n))
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, sa, sb, out_dtype)


# 128x192 tiles read two of b[g]'s 128-column scale blocks (tests/test_fp8_gpu.py,
# test_fp8_block_wise_wide_tiles), here 16x apart, in every group.
@pytest.mark.parametrize("N,K", [(192, 128), (320, 384), (384, 1008), (576, 128), (1000, 384)], ids=str)
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_contiguous_block_wise_192_wide_tiles(torch, N, K, out_dtype):
    sizes = [0, 1, 129, 1000, 65, 128]
    a, b, offsets, sa, sb = _contiguous(torch, sizes, N, K)
    contrast_column_blocks(torch, sb)
    out = _nan_out(torch, (a.shape[0], N), out_dtype)
    grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb, config=GemmConfig(block_m=128, block_n=192))
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, sa, sb, out_dtype)


@pytest.mark.parametrize("fp8,out_dtype", [("e4m3", "f16"), ("e5m2", "bf16"), ("e5m2", "f32")])
def test_contiguous_block_wise_dtypes(torch, fp8, out_dtype):
    sizes = [300, 0, 129, 512]
    a, b, offsets, sa, sb = _contiguous(torch, sizes, 640, 1024, fp8=fp8, extra=0)
    out = grouped_gemm(a, b, offsets, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    assert out.shape == (sum(sizes), 640) and out.dtype == getattr(torch, TORCH_OUT[out_dtype])
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, sa, sb, out_dtype)


def test_contiguous_block_wise_default_output_is_bf16(torch):
    a, b, offsets, sa, sb = _contiguous(torch, [200, 57], 256, 256, extra=0)
    out = grouped_gemm(a, b, offsets, scale_a=sa, scale_b=sb)
    assert out.dtype == torch.bfloat16 and out.shape == (257, 256)
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, [200, 57], sa, sb)


def test_contiguous_block_wise_large_k(torch):
    """DeepSeek-V3's up projection (K = 7168), skewed groups: the bound does not grow with K."""
    sizes = [0, 1000, 100, 100, 257]
    a, b, offsets, sa, sb = _contiguous(torch, sizes, 512, 7168)
    out = _nan_out(torch, (a.shape[0], 512))
    grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, sa, sb)


@pytest.mark.parametrize("activation", [None, "silu"])
def test_contiguous_block_wise_row_scale_and_activation(torch, activation):
    sizes = [300, 0, 5, 1000, 129]
    a, b, offsets, sa, sb = _contiguous(torch, sizes, 512, 384)
    weights = torch.rand(a.shape[0], device="cuda") + 0.5  # routing weights
    out = _nan_out(torch, (a.shape[0], 512))
    grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb, row_scale=weights, activation=activation)
    torch.cuda.synchronize()
    act = torch.nn.functional.silu if activation else (lambda x: x)
    _check_contiguous(torch, out, a, b, sizes, sa, sb,
                      post=lambda ref, rows: act(ref * weights[rows].double()[:, None]))


COUNTS = {"mixed": [0, 1, 7, 129, 256, 255, 64, 65], "G=1 full": [256], "empty": [0, 0]}


@pytest.mark.parametrize("counts", COUNTS.values(), ids=COUNTS.keys())
@pytest.mark.parametrize("layout", ["torch", "rows"])
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_masked_block_wise(torch, counts, layout, out_dtype):
    M, N, K = 256, 384, 272
    a, b, masked_m, sa, sb = _masked(torch, counts, M, N, K, layout=layout)
    out = _nan_out(torch, (len(counts), M, N), out_dtype)
    grouped_gemm(a, b, masked_m=masked_m, out=out, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    _check_masked(torch, out, a, b, counts, sa, sb, out_dtype)


@pytest.mark.parametrize("block_m,block_n", [(64, 128), (128, 64), (128, 192)])
def test_masked_block_wise_tiles(torch, block_m, block_n):
    counts = [3, 0, 200, 64, 130]
    M, N, K = 200, 256, 1024 + 48
    a, b, masked_m, sa, sb = _masked(torch, counts, M, N, K, fp8="e5m2")
    out = _nan_out(torch, (len(counts), M, N))
    grouped_gemm(a, b, masked_m=masked_m, out=out, scale_a=sa, scale_b=sb,
                 config=GemmConfig(block_m=block_m, block_n=block_n))
    torch.cuda.synchronize()
    _check_masked(torch, out, a, b, counts, sa, sb)


@pytest.mark.parametrize("scales", [(None, None), (0.75, 1.5)], ids=["unscaled", "numbers"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("fast", [False, True], ids=["promoted", "fast_accum"])
def test_per_tensor_numbers(torch, scales, masked, fast):
    """fp8 groups without block-wise scales: numbers multiply the output; promoted by default,
    or accumulated in the tensor cores (``use_fast_accum=True``), each within its bound."""
    N, K = 384, 2560
    factor = 1.0 if scales[0] is None else scales[0] * scales[1]
    if masked:
        counts = [0, 100, 256, 3]
        a, b, masked_m, _, _ = _masked(torch, counts, 256, N, K)
        out = _nan_out(torch, (len(counts), 256, N))
        grouped_gemm(a, b, masked_m=masked_m, out=out, scale_a=scales[0], scale_b=scales[1], use_fast_accum=fast)
        groups = [(out[g, :m], a[g, :m], g) for g, m in enumerate(counts) if m]
        unwritten = [out[g, m:] for g, m in enumerate(counts)]
    else:
        sizes = [0, 100, 700, 3]
        a, b, offsets, _, _ = _contiguous(torch, sizes, N, K)
        out = _nan_out(torch, (a.shape[0], N))
        grouped_gemm(a, b, offsets, out=out, scale_a=scales[0], scale_b=scales[1], use_fast_accum=fast)
        ends = list(itertools.accumulate(sizes))
        groups = [(out[e - n:e], a[e - n:e], g) for g, (n, e) in enumerate(zip(sizes, ends)) if n]
        unwritten = [out[ends[-1]:]]
    torch.cuda.synchronize()
    for got, rows, g in groups:
        _check_group(torch, got, factor * (rows.double() @ b[g].double()), tolerance("bf16", K, fast), f"group {g}")
    assert all(torch.isnan(x).all() for x in unwritten), "rows outside the groups were written"


def test_numba_uint8_operands(torch):
    """numba arrays: fp8 bits as uint8 with dtype="e4m3", b[g] K-major (strided), scales and
    offsets as numba arrays, an f32 output."""
    sizes = [100, 0, 300]
    a, b, offsets, sa, sb = _contiguous(torch, sizes, 256, 384)
    out = torch.full((a.shape[0], 256), float("nan"), device="cuda")
    nb = lambda x: cuda.as_cuda_array(x)  # noqa: E731
    grouped_gemm(nb(a.view(torch.uint8)), nb(b.view(torch.uint8)), nb(offsets), out=nb(out), scale_a=nb(sa),
                 scale_b=nb(sb), dtype="e4m3")
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, sa, sb, "f32")


def test_block_scales_are_read_per_call(torch):
    """Later calls of one layout (a cached plan) read their own operands and scales."""
    sizes = [129, 0, 400]
    for seed in range(3):
        a, b, offsets, sa, sb = _contiguous(torch, sizes, 384, 512, seed=10 * seed)
        out = _nan_out(torch, (a.shape[0], 384))
        grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        _check_contiguous(torch, out, a, b, sizes, sa, sb)


def _captured(torch, call):
    """A CUDA graph of ``call()``, warmed up (compiled, planned) on a side stream first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def test_masked_cuda_graph_replays_read_new_sizes_and_scales(torch):
    """masked_m and the scales are read by the kernel at each launch: a replay after they
    (and the operands) changed in place uses the new ones."""
    G, M, N, K = 16, 256, 512, 384
    a, b, masked_m, sa, sb = _masked(torch, [M // 2] * G, M, N, K)
    out = torch.empty(G, M, N, device="cuda", dtype=torch.bfloat16)
    graph = _captured(torch, lambda: grouped_gemm(a, b, masked_m=masked_m, out=out, scale_a=sa, scale_b=sb))
    gen = _gen(torch, 0)
    for trial in range(3):
        counts = torch.randint(0, M + 1, (G,), device="cuda", dtype=torch.int32, generator=gen)
        counts[0], counts[1] = 0, M
        masked_m.copy_(counts)
        a.copy_(_fp8(torch, torch.randn(a.shape, generator=gen, device="cuda") * 2, "e4m3"))
        sa.copy_(torch.rand(sa.shape, generator=gen, device="cuda") + 0.5)
        sb.copy_(torch.rand(sb.shape, generator=gen, device="cuda") + 0.5)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_masked(torch, out, a, b, masked_m.tolist(), sa, sb)


def test_contiguous_cuda_graph_replays_read_new_offsets(torch):
    sizes = [100, 200, 300, 400]
    a, b, offsets, sa, sb = _contiguous(torch, sizes, 256, 256, extra=100)
    out = torch.empty(a.shape[0], 256, device="cuda", dtype=torch.bfloat16)
    graph = _captured(torch, lambda: grouped_gemm(a, b, offsets, out=out, scale_a=sa, scale_b=sb))
    for new in ([0, 1000, 0, 3], [250, 250, 250, 250], [1, 2, 3, 4]):
        offsets.copy_(torch.tensor(list(itertools.accumulate(new)), dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_contiguous(torch, out, a, b, new, sa, sb)


def test_matches_torch_scaled_mm_per_group(torch):
    """Against a loop of torch._scaled_mm (cuBLASLt's block-wise product) over the groups, with
    the same scales in the strides it asks for: both within the bound of float64, and of
    each other."""
    sizes = [256, 0, 512, 128, 384]
    N, K = 1024, 1024
    a, b, offsets, sa, sb = _contiguous(torch, sizes, N, K, extra=0)
    ours = grouped_gemm(a, b, offsets, scale_a=sa, scale_b=sb)
    theirs = torch.zeros_like(ours)
    start = 0
    for g, n in enumerate(sizes):
        if n:
            rows = slice(start, start + n)
            try:
                theirs[rows] = torch._scaled_mm(a[rows], b[g], scale_a=sa[rows].t().contiguous().t(),
                                                scale_b=sb[g].t().contiguous().t(), out_dtype=torch.bfloat16)
            except (RuntimeError, NotImplementedError) as e:
                pytest.skip(f"torch._scaled_mm refuses block-wise scales here: {e}")
        start += n
    torch.cuda.synchronize()
    start = 0
    for g, n in enumerate(sizes):
        if n:
            rows = slice(start, start + n)
            ref = _block_reference(torch, a[rows], b[g], sa[rows], sb[g])
            e_ours, e_theirs = _rel(torch, ours[rows], ref), _rel(torch, theirs[rows], ref)
            assert e_ours < tolerance("bf16"), (g, e_ours, e_theirs)
            assert _rel(torch, ours[rows], theirs[rows]) < tolerance("bf16"), (g, e_ours, e_theirs)
        start += n
