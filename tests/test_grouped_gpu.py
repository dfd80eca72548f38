"""Grouped GEMM on the H100: contiguous and masked groups against float64 per group, the rows
it must not write, the fused row scale + activation, CUDA-graph replays with new sizes,
torch._grouped_mm, debug mode and the call path's promise not to wait for the GPU."""

import itertools
import time

import pytest

from numba_hopper import GemmConfig, grouped_gemm

pytestmark = pytest.mark.gpu

TOL = 1e-2  # relative Frobenius error against float64: bf16/f16 output rounding with room to spare


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _dtype(torch, name):
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def _b(torch, G, K, N, layout, dtype):
    """(G, K, N): each b[g] row-major ("KN"), or a (G, N, K) tensor's transpose ("NK")."""
    if layout == "KN":
        return torch.randn(G, K, N, device="cuda").to(dtype)
    return torch.randn(G, N, K, device="cuda").to(dtype).transpose(1, 2)


def _err(got, ref):
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _contiguous(torch, sizes, N, K, dtype, layout, extra=37):
    """a with ``extra`` rows past the last group, b, offsets."""
    rows = sum(sizes) + extra
    a = torch.randn(rows, K, device="cuda").to(dtype)
    ends = list(itertools.accumulate(sizes))
    return a, _b(torch, len(sizes), K, N, layout, dtype), torch.tensor(ends, device="cuda", dtype=torch.int32)


def _check_contiguous(torch, out, a, b, sizes, scale=None, act=None):
    """Every group's rows against float64, and every row past the last group still NaN."""
    start = 0
    for g, n in enumerate(sizes):
        if n:
            ref = a[start:start + n].double() @ b[g].double()
            if scale is not None:
                ref = ref * scale[start:start + n].double()[:, None]
            if act is not None:
                ref = act(ref)
            got = out[start:start + n]
            assert torch.isfinite(got).all(), f"group {g} ({n} rows) has unwritten or non-finite values"
            assert _err(got, ref) < TOL, (g, n, _err(got, ref))
        start += n
    assert torch.isnan(out[start:]).all(), "rows past offsets[-1] were written"


SIZES = {
    "0-1-7-129-1000": [0, 1, 7, 129, 1000],
    "skewed": [64, 0, 100, 100, 1000, 100, 100, 100],  # one empty group, one of 10x the others
    "G=1": [777],
    "many": [(37 * g) % 301 for g in range(40)],
    "full tiles": [128, 256, 0, 384],
    "all empty": [0, 0, 0],
}


@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("layout", ["KN", "NK"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_contiguous(torch, sizes, layout, dtype):
    N, K = 320, 200  # a partial column tile and a partial k-block
    a, b, offsets = _contiguous(torch, sizes, N, K, _dtype(torch, dtype), layout)
    out = torch.full((a.shape[0], N), float("nan"), device="cuda", dtype=_dtype(torch, dtype))
    assert grouped_gemm(a, b, offsets, out=out) is out
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes)


# Kernels beside the default: 64-row tiles (one consumer), 160-wide tiles (64-byte sub-tile
# swizzle), an f32 output (32-column sub-tiles of 4-byte elements).
@pytest.mark.parametrize("config,out_dtype", [(GemmConfig(block_m=64, block_n=64), "bf16"),
                                              (GemmConfig(block_n=160), "f16"), (GemmConfig(block_n=128), "f32")])
@pytest.mark.parametrize("layout", ["KN", "NK"])
def test_contiguous_other_tiles(torch, config, out_dtype, layout):
    sizes = SIZES["0-1-7-129-1000"] + [65, 63]
    N, K = 1000, 136
    a, b, offsets = _contiguous(torch, sizes, N, K, torch.bfloat16, layout)
    out = torch.full((a.shape[0], N), float("nan"), device="cuda", dtype=_dtype(torch, out_dtype))
    grouped_gemm(a, b, offsets, out=out, config=config)
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes)


def test_contiguous_no_groups(torch):
    a = torch.randn(10, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(0, 64, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full((10, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, torch.zeros(0, device="cuda", dtype=torch.int32), out=out)
    torch.cuda.synchronize()
    assert torch.isnan(out).all()


@pytest.mark.parametrize("activation", [None, "silu"])
def test_contiguous_row_scale_and_activation(torch, activation):
    sizes = [300, 0, 5, 1000, 129]
    a, b, offsets = _contiguous(torch, sizes, 512, 256, torch.bfloat16, "NK")
    scale = torch.rand(a.shape[0], device="cuda") + 0.5  # routing weights
    out = torch.full((a.shape[0], 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, offsets, out=out, row_scale=scale, activation=activation)
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, scale, torch.nn.functional.silu if activation else None)


def test_contiguous_per_tensor_numbers(torch):
    """scale_a/scale_b numbers multiply the output of 16-bit groups too (the epilogue's alpha)."""
    sizes = [300, 0, 129]
    a, b, offsets = _contiguous(torch, sizes, 256, 128, torch.bfloat16, "NK")
    out = torch.full((a.shape[0], 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, offsets, out=out, scale_a=0.5, scale_b=3.0)
    torch.cuda.synchronize()
    _check_contiguous(torch, out, a, b, sizes, scale=torch.full((a.shape[0],), 1.5, device="cuda"))


def test_contiguous_new_output(torch):
    sizes = [200, 0, 57]
    a, b, offsets = _contiguous(torch, sizes, 256, 128, torch.float16, "KN", extra=0)
    out = grouped_gemm(a, b, offsets)
    assert out.shape == (257, 256) and out.dtype == torch.float16
    torch.cuda.synchronize()
    for g, (s, e) in enumerate([(0, 200), (200, 200), (200, 257)]):
        if e > s:
            assert _err(out[s:e], a[s:e].double() @ b[g].double()) < TOL


def _masked(torch, G, M, N, K, dtype, layout, counts):
    a = torch.randn(G, M, K, device="cuda").to(dtype)
    return a, _b(torch, G, K, N, layout, dtype), torch.tensor(counts, device="cuda", dtype=torch.int32)


def _check_masked(torch, out, a, b, counts, scale=None, act=None):
    for g, m in enumerate(counts):
        if m:
            ref = a[g, :m].double() @ b[g].double()
            if scale is not None:
                ref = ref * scale[g, :m].double()[:, None]
            if act is not None:
                ref = act(ref)
            assert torch.isfinite(out[g, :m]).all(), f"group {g}: rows below masked_m unwritten"
            assert _err(out[g, :m], ref) < TOL, (g, m, _err(out[g, :m], ref))
        assert torch.isnan(out[g, m:]).all(), f"group {g}: rows at or past masked_m[g] = {m} were written"


@pytest.mark.parametrize("counts", [[0, 1, 7, 129, 256, 255, 64, 65], [256], [0, 0]], ids=["mixed", "G=1 full", "empty"])
@pytest.mark.parametrize("layout", ["KN", "NK"])
@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32")])
def test_masked(torch, counts, layout, dtype, out_dtype):
    G, M, N, K = len(counts), 256, 384, 264
    a, b, masked_m = _masked(torch, G, M, N, K, _dtype(torch, dtype), layout, counts)
    out = torch.full((G, M, N), float("nan"), device="cuda", dtype=_dtype(torch, out_dtype))
    grouped_gemm(a, b, masked_m=masked_m, out=out)
    torch.cuda.synchronize()
    _check_masked(torch, out, a, b, counts)


@pytest.mark.parametrize("config", [None, GemmConfig(block_m=64, block_n=128)])
def test_masked_row_scale_and_silu(torch, config):
    counts = [3, 0, 200, 64, 130]
    G, M, N, K = len(counts), 200, 256, 128
    a, b, masked_m = _masked(torch, G, M, N, K, torch.bfloat16, "NK", counts)
    scale = torch.rand(G, M, device="cuda") + 0.5
    out = torch.full((G, M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, masked_m=masked_m, out=out, row_scale=scale, activation="silu", config=config)
    torch.cuda.synchronize()
    _check_masked(torch, out, a, b, counts, scale, torch.nn.functional.silu)


def test_masked_cuda_graph_replays_read_new_sizes(torch):
    """masked_m is read by the kernel at each launch: a replay after it changed uses the new sizes."""
    G, M, N, K = 16, 256, 512, 256
    a, b, masked_m = _masked(torch, G, M, N, K, torch.bfloat16, "NK", [M // 2] * G)
    out = torch.empty(G, M, N, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, plan) before capturing
        grouped_gemm(a, b, masked_m=masked_m, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(a, b, masked_m=masked_m, out=out)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for trial in range(3):
        counts = torch.randint(0, M + 1, (G,), device="cuda", dtype=torch.int32, generator=gen)
        counts[0], counts[1] = 0, M
        masked_m.copy_(counts)
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_masked(torch, out, a, b, masked_m.tolist())


def test_contiguous_cuda_graph_replays_read_new_offsets(torch):
    sizes = [100, 200, 300, 400]
    a, b, offsets = _contiguous(torch, sizes, 256, 128, torch.bfloat16, "KN", extra=100)
    out = torch.empty(a.shape[0], 256, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grouped_gemm(a, b, offsets, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(a, b, offsets, out=out)
    for new in ([0, 1000, 0, 3], [250, 250, 250, 250], [1, 2, 3, 4]):
        offsets.copy_(torch.tensor(list(itertools.accumulate(new)), dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_contiguous(torch, out, a, b, new)


@pytest.mark.parametrize("layout", ["NK", "KN"])
def test_matches_torch_grouped_mm(torch, layout):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this PyTorch has no torch._grouped_mm")
    sizes = [256, 0, 512, 128, 1024, 128, 384, 256]  # multiples of 16 (what some versions ask of offs)
    a, b, offsets = _contiguous(torch, sizes, 1024, 512, torch.bfloat16, layout, extra=0)
    try:
        theirs = torch._grouped_mm(a, b, offs=offsets)
    except RuntimeError as exc:
        pytest.skip(f"torch._grouped_mm refuses this layout: {exc}")
    ours = grouped_gemm(a, b, offsets)
    torch.cuda.synchronize()
    ref = torch.cat([a[s:e].double() @ b[g].double() for g, (s, e) in
                     enumerate(zip([0] + offsets.tolist()[:-1], offsets.tolist()))])
    assert _err(ours, ref) < TOL and _err(theirs, ref) < TOL
    assert _err(ours, theirs.double()) < 2 * TOL


def test_debug_mode_checks_the_sizes(torch):
    a, b, _ = _contiguous(torch, [10, 20], 128, 64, torch.bfloat16, "KN")
    bad = torch.tensor([20, 10], device="cuda", dtype=torch.int32)
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_gemm(a, b, bad, debug=True)
    with pytest.raises(ValueError, match="past the"):
        grouped_gemm(a, b, torch.tensor([10, 10**6], device="cuda", dtype=torch.int32), debug=True)
    a3 = torch.randn(2, 64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="masked_m"):
        grouped_gemm(a3, b, masked_m=torch.tensor([3, 65], device="cuda", dtype=torch.int32), debug=True)
    good = torch.tensor([10, 30], device="cuda", dtype=torch.int32)
    out = torch.full((a.shape[0], 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, good, out=out, debug=True)  # the debug build, synchronized
    _check_contiguous(torch, out, a, b, [10, 20])


@pytest.mark.serial
def test_a_call_never_waits_for_the_gpu(torch):
    sizes = [500, 700, 0, 900]
    a, b, offsets = _contiguous(torch, sizes, 1024, 1024, torch.bfloat16, "NK")
    grouped_gemm(a, b, offsets)  # the plan exists; the operands below are new to it
    fresh = _contiguous(torch, sizes, 1024, 1024, torch.bfloat16, "NK")
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning on the current stream
    gate = torch.cuda.Event()
    gate.record()
    start = time.perf_counter()
    out = grouped_gemm(*fresh)
    host = time.perf_counter() - start
    assert not gate.query(), "grouped_gemm returned only after the queued sleep had finished"
    assert host < 0.05, host
    torch.cuda.synchronize()
    out[sum(sizes):] = float("nan")  # (a new output: rows past the groups are uninitialized)
    _check_contiguous(torch, out, fresh[0], fresh[1], sizes)
