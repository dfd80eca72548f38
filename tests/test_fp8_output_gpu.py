"""FP8 outputs on the H100: ``out = fp8(scale_out * z)`` with saturation, and ``amax_out = max |z|``,
where ``z`` is the fused epilogue's value.

Two references. The kernel's own float32 ``z`` (the same call with a float32 output, whose
accuracy the float32 tests bound) rounded by torch: an fp8 output must equal it bit for bit,
so a misplaced, unscaled or unsaturated element fails. And float64: the fp8 output's relative
norm error must be within the format's rounding (``2^-(m+1)`` for m mantissa bits) plus the
fp8 accumulation's. Per element, float64 is no reference: FP8 wgmma accumulates with fewer
bits than float32, and an element near 0 (from cancellation) or at a rounding tie lands on
another fp8 value. The output is poisoned with NaN (an fp8 NaN) before each call, so an
element left unwritten fails.
"""

import pytest
from numba import cuda

from numba_hopper import bmm, gemm
from test_fp8_gpu import FP8, _block_reference, _block_scales, _operands, _reference

pytestmark = pytest.mark.gpu

MANTISSA = {"e4m3": 3, "e5m2": 2}
LARGEST = {"e4m3": 448.0, "e5m2": 57344.0}


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8 dtypes")
    return torch


def _poisoned(torch, shape, fp8):
    return torch.full(shape, float("nan"), device="cuda").to(getattr(torch, FP8[fp8]))


def _rounded(torch, z, scale, fp8):
    """``scale * z`` saturated and rounded to ``fp8`` (as the kernel's ``cvt.rn.satfinite``), as float64."""
    return (z * scale).clamp(-LARGEST[fp8], LARGEST[fp8]).to(getattr(torch, FP8[fp8])).double()


def _own_f32(torch, *args, out=None, **kw):
    """The kernel's float32 ``z`` for the call ``gemm(*args, **kw)``: with ``amax_out`` its
    epilogue is fused, so it neither splits K nor runs stream-K, as an fp8 output never does."""
    kw = {**kw, "amax_out": torch.zeros(1, device="cuda")}
    return gemm(*args, out, **kw) if out is not None else gemm(*args, out_dtype="f32", **kw)


def _check_fp8(torch, got, own, z, scale, fp8, what=""):
    """``got``: the fp8 output; ``own``: the kernel's float32 ``z``; ``z``: the float64 one."""
    g = got.double()
    assert not torch.isnan(g).any(), f"{what}: NaN left in the output"
    differ = (g != _rounded(torch, own.float(), scale, fp8)).sum().item()
    assert differ == 0, f"{what}: {differ} elements are not the fp8 rounding of the kernel's float32 value"
    want = (z * scale).clamp(-LARGEST[fp8], LARGEST[fp8])
    err = ((g - want).norm() / want.norm()).item()
    assert err <= 2.0 ** -(MANTISSA[fp8] + 1) + 2e-3, f"{what}: relative error {err:.3g} against float64"
    return err


def _check_amax(torch, amax, own, z, what=""):
    """``amax`` is exactly the kernel's largest float32 ``|z|``, and near float64's."""
    mine, want = amax.item(), own.abs().max().item()
    assert mine == want, f"{what}: amax {mine} is not the largest |z| {want}"
    exact = z.abs().max().item()
    assert abs(mine - exact) <= 1e-2 * exact, f"{what}: amax {mine}, float64 {exact}"


SHAPES = [(1, 1, 16), (7, 7, 32), (64, 64, 64), (129, 129, 144), (1000, 7, 512), (7, 1000, 512),
          (1000, 1000, 1024)]


@pytest.mark.parametrize("M,N,K", SHAPES, ids=str)
@pytest.mark.parametrize("scale_out", ["none", "number", "tensor"])
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_outputs_match_float64(torch, M, N, K, scale_out, fp8):
    """e4m3 inputs with per-tensor scales, into an ``out=`` of either fp8 type."""
    a, b = _operands(torch, M, N, K)
    scale = {"none": 1.0, "number": 0.25, "tensor": 0.25}[scale_out]
    kw = {} if scale_out == "none" else {"scale_out": scale if scale_out == "number" else
                                         torch.tensor([scale], device="cuda")}
    out = _poisoned(torch, (M, N), fp8)
    assert gemm(a, b, out, scale_a=0.5, scale_b=2.0, **kw) is out
    own = _own_f32(torch, a, b, scale_a=0.5, scale_b=2.0)
    _check_fp8(torch, out, own, _reference(torch, a, b, 0.5, 2.0), scale, fp8, f"{M}x{N}x{K} -> {fp8}")


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_output_of_16_bit_inputs(torch, fp8):
    """A fresh fp8 output (``out_dtype``) of bf16 operands, with a fused bias and activation."""
    M, N, K = 1000, 1500, 2048
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    bias = torch.randn(N, device="cuda").to(torch.bfloat16)
    got = gemm(a, b, bias=bias, activation="gelu_tanh", out_dtype=fp8, scale_out=0.125)
    assert got.dtype == getattr(torch, FP8[fp8]) and got.shape == (M, N)
    z = torch.nn.functional.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")
    own = _own_f32(torch, a, b, bias=bias, activation="gelu_tanh")
    _check_fp8(torch, got, own, z, 0.125, fp8, f"bf16 -> {fp8}")


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_outputs_saturate(torch, fp8):
    """Values past the format's largest finite value become it (with their sign), not NaN."""
    M, N, K = 256, 384, 512
    a, b = _operands(torch, M, N, K)
    z = _reference(torch, a, b, None, None)
    scale = 4 * LARGEST[fp8] / z.abs().max().item()  # about a third of the elements overflow
    got = gemm(a, b, out_dtype=fp8, scale_out=scale)
    g = got.double()
    big = (z * scale).abs() > 1.5 * LARGEST[fp8]
    assert big.sum().item() > 100
    assert torch.equal(g[big].abs(), torch.full_like(g[big], LARGEST[fp8]))
    assert torch.equal(g[big].sign(), z[big].sign())
    _check_fp8(torch, got, _own_f32(torch, a, b), z, scale, fp8, "saturated")


@pytest.mark.parametrize("out_dtype", ["e4m3", "bf16", "f32"])
def test_amax_is_the_largest_magnitude_before_the_output_scale(torch, out_dtype):
    """``amax_out`` is overwritten (it starts at 1e30 here) with max |z| of this call."""
    M, N, K = 1000, 1500, 1024
    a, b = _operands(torch, M, N, K)
    bias = torch.randn(N, device="cuda").to(torch.bfloat16)
    amax = torch.full((1,), 1e30, device="cuda")
    kw = {"scale_out": 0.5} if out_dtype == "e4m3" else {}
    gemm(a, b, scale_a=0.5, bias=bias, activation="silu", out_dtype=out_dtype, amax_out=amax, **kw)
    z = torch.nn.functional.silu(_reference(torch, a, b, 0.5, None) + bias.double())
    _check_amax(torch, amax, _own_f32(torch, a, b, scale_a=0.5, bias=bias, activation="silu"), z, out_dtype)


def test_amax_ignores_the_padding_of_partial_tiles(torch):
    """Rows past M in a partial tile hold the bias too (their accumulators are 0): here every
    real element is 0 (A's first column of ones times B's first row, -bias) and the padding
    rows would hold the bias, so the amax must be exactly 0."""
    M, N, K = 7, 200, 16
    bias = torch.arange(1, N + 1, device="cuda").to(torch.bfloat16)  # exact in bf16
    a = torch.zeros(M, K, device="cuda", dtype=torch.bfloat16)
    a[:, 0] = 1
    b = torch.zeros(K, N, device="cuda", dtype=torch.bfloat16)
    b[0] = -bias
    amax = torch.full((1,), 1e30, device="cuda")
    out = gemm(a, b, bias=bias, amax_out=amax, out_dtype="f32")
    assert torch.equal(out, torch.zeros_like(out))
    assert amax.item() == 0.0


def test_fp8_output_with_block_wise_scales(torch):
    M, N, K = 1000, 1536, 2048 + 80
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    amax = torch.zeros(1, device="cuda")
    got = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="e4m3", scale_out=torch.tensor([0.5], device="cuda"),
               amax_out=amax)
    z, own = _block_reference(torch, a, b, sa, sb), _own_f32(torch, a, b, scale_a=sa, scale_b=sb)
    _check_fp8(torch, got, own, z, 0.5, "e4m3", "block-wise")
    _check_amax(torch, amax, own, z, "block-wise")


def test_fp8_column_major_output(torch):
    """A column-major out runs the transposed product (scale_a then scales the kernel's
    columns): the amax and output scale are the same."""
    M, N, K = 300, 200, 256
    a, b = _operands(torch, M, N, K)
    sa = torch.rand(M, device="cuda") + 0.5
    out = _poisoned(torch, (N, M), "e4m3").t()
    amax = torch.zeros(1, device="cuda")
    gemm(a, b, out, scale_a=sa, scale_out=2.0, amax_out=amax)
    z = _reference(torch, a, b, sa, None)
    own = _own_f32(torch, a, b, scale_a=sa, out=torch.empty(N, M, device="cuda").t())  # the same transposed kernel
    _check_fp8(torch, out, own, z, 2.0, "e4m3", "column-major")
    _check_amax(torch, amax, own, z, "column-major")


def test_fp8_output_numba_uint8(torch):
    """numba holds fp8 outputs as uint8 with ``out_dtype``; a fresh one is a uint8 array."""
    M, N, K = 200, 300, 256
    a, b = _operands(torch, M, N, K)
    out = cuda.as_cuda_array(_poisoned(torch, (M, N), "e4m3").view(torch.uint8))
    na, nb = cuda.as_cuda_array(a.view(torch.uint8)), cuda.as_cuda_array(b.view(torch.uint8))
    gemm(na, nb, out, dtype="e4m3", out_dtype="e4m3")
    got = torch.as_tensor(out, device="cuda").view(torch.float8_e4m3fn)
    z, own = _reference(torch, a, b, None, None), _own_f32(torch, a, b)
    _check_fp8(torch, got, own, z, 1.0, "e4m3", "numba")
    fresh = gemm(na, nb, dtype="e4m3", out_dtype="e5m2")
    assert fresh.dtype.name == "uint8" and fresh.shape == (M, N)
    got = torch.as_tensor(fresh, device="cuda").view(torch.float8_e5m2)
    _check_fp8(torch, got, own, z, 1.0, "e5m2", "numba fresh")


def test_bmm_fp8_output(torch):
    B, M, N, K = 3, 200, 256, 128
    a = torch.randn(B, M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(B, K, N, device="cuda").to(torch.bfloat16)
    out = _poisoned(torch, (B, M, N), "e4m3")
    bmm(a, b, out)
    own = bmm(a, b, torch.empty(B, M, N, device="cuda"))
    _check_fp8(torch, out, own, a.double() @ b.double(), 1.0, "e4m3", "bmm")


def test_fp8_output_matches_torch_scaled_mm(torch):
    """The same per-tensor product with torch's ``scale_result`` into e4m3: as accurate."""
    M, N, K = 1024, 2048, 4096
    a, b = _operands(torch, M, N, K)
    sa, sb, so = (torch.tensor(x, device="cuda") for x in (0.5, 2.0, 0.25))
    try:
        theirs = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, scale_result=so, out_dtype=torch.float8_e4m3fn)
    except (RuntimeError, NotImplementedError, TypeError) as e:
        pytest.skip(f"torch._scaled_mm refuses an fp8 output here: {e}")
    ours = gemm(a, b, scale_a=sa, scale_b=sb, scale_out=so, out_dtype="e4m3")
    z = _reference(torch, a, b, 0.5, 2.0)
    want = (z * 0.25).clamp(-LARGEST["e4m3"], LARGEST["e4m3"])  # (its scale_result multiplies too)
    theirs_err = ((theirs.double() - want).norm() / want.norm()).item()
    ours_err = _check_fp8(torch, ours, _own_f32(torch, a, b, scale_a=sa, scale_b=sb), z, 0.25, "e4m3", "ours")
    assert ours_err <= 1.02 * theirs_err, (ours_err, theirs_err)


@pytest.mark.serial
def test_fp8_output_calls_never_wait_and_replay_in_a_graph(torch):
    """A cached layout with scale_out and amax_out (a memset, then the kernel) returns while the
    stream is busy; captured in a CUDA graph, replays read new inputs and scale and rewrite
    the amax."""
    import time

    M, N, K = 512, 1024, 1024
    a, b = _operands(torch, M, N, K)
    scale, amax = torch.tensor([0.5], device="cuda"), torch.zeros(1, device="cuda")
    gemm(a, b, out_dtype="e4m3", scale_out=scale, amax_out=amax)  # the plan exists
    a2, b2 = _operands(torch, M, N, K, seed=5)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    gate = torch.cuda.Event()
    gate.record()
    start = time.perf_counter()
    out = gemm(a2, b2, out_dtype="e4m3", scale_out=scale, amax_out=amax)
    host = time.perf_counter() - start
    assert not gate.query(), "gemm returned only after the queued sleep had finished"
    assert host < 0.05, host
    torch.cuda.synchronize()
    z, own = _reference(torch, a2, b2, None, None), _own_f32(torch, a2, b2)
    _check_fp8(torch, out, own, z, 0.5, "e4m3", "second call")
    _check_amax(torch, amax, own, z, "second call")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gemm(a, b, out_dtype="e4m3", scale_out=scale, amax_out=amax)  # warm-up on the capturing stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static = gemm(a, b, out_dtype="e4m3", scale_out=scale, amax_out=amax)
    torch.cuda.current_stream().wait_stream(stream)
    for seed, s in ((7, 0.25), (8, 2.0)):
        a_new, b_new = _operands(torch, M, N, K, seed=seed)
        a.copy_(a_new)
        b.copy_(b_new)
        scale.fill_(s)
        graph.replay()
        torch.cuda.synchronize()
        z, own = _reference(torch, a, b, None, None), _own_f32(torch, a, b)
        _check_fp8(torch, static, own, z, s, "e4m3", f"replay {seed}")
        _check_amax(torch, amax, own, z, f"replay {seed}")
