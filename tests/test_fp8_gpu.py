"""FP8 GEMM on the H100: e4m3/e5m2 TN products with per-tensor and row-wise scales, against a
float64 reference of the dequantized operands and against ``torch._scaled_mm``.

Tolerances (relative Frobenius-norm error, ``tolerance(out_dtype, K, fast)``). Products of
two fp8 values are exact in f32, so the error has two sources:

- the output rounding: bf16 keeps 8 bits (RMS about 2^-9 / sqrt(3) = 1.1e-3 relative), f16
  11 bits; the bound allows 5e-3 (bf16) and 1e-3 (f16, f32);
- FP8 wgmma's accumulator, which keeps about 14 bits rather than f32's 24 (DeepSeek-V3's
  measurement on the H800). By default the kernel promotes it into an f32 register sum every
  128 K (as cuBLASLt's default), so its error (about 2^-14 per k-block's four k32 steps;
  measured 1.2e-4 at K = 16384) does not grow with K: 3e-4. With ``use_fast_accum=True``
  (as ``torch._scaled_mm(use_fast_accum=True)``) it is modelled as a truncation of up to
  2^-14 (mean 2^-15) of the running sum at each of the K / 32 steps, a bias growing with K,
  about 2^-15 * (2/3) * K / 32 = 6.4e-7 * K relative (1e-2 at K = 16384).

Every failure message prints the measured error.
"""

import pytest
from numba import cuda

from numba_hopper import GemmConfig, gemm

pytestmark = pytest.mark.gpu

ROUNDING = {"bf16": 5e-3, "f16": 1e-3, "f32": 1e-3}


def tolerance(out_dtype, K=0, fast=False):
    """The bound on the relative Frobenius error of an fp8 product of depth K, promoted or with
    ``use_fast_accum=True`` (module docstring)."""
    return ROUNDING[out_dtype] + (6.4e-7 * K if fast else 3e-4)
TORCH_OUT = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8 dtypes")
    return torch


def _operands(torch, M, N, K, fp8="e4m3", seed=0):
    """A (M, K) row-major and B = W.t() of a row-major (N, K) W: fp8 from scaled normals."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, FP8[fp8])
    a = (torch.randn(M, K, generator=gen, device="cuda") * 2).to(dt)
    w = (torch.randn(N, K, generator=gen, device="cuda") * 0.5).to(dt)
    return a, w.t()


def _scales(torch, kind, M, N, seed=1):
    """``(scale_a, scale_b)`` for gemm: per-tensor as numbers ("number") or one-element
    tensors ("tensor"), or row-wise vectors ("rowwise")."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "none":
        return None, None
    if kind == "number":
        return 0.75, 1.5
    if kind == "tensor":
        return torch.tensor(0.75, device="cuda"), torch.tensor(1.5, device="cuda")
    return (torch.rand(M, generator=gen, device="cuda") + 0.5, torch.rand(N, generator=gen, device="cuda") + 0.5)


def _reference(torch, a, b, scale_a, scale_b):
    """float64 ``(scale_a * A) @ (B * scale_b)`` of the dequantized operands."""
    ad, bd = a.double(), b.double()
    for s, x, side in ((scale_a, "a", 0), (scale_b, "b", 1)):
        if s is None:
            continue
        s = torch.as_tensor(s, device="cuda").double()
        if s.dim() == 1 and s.numel() > 1:
            s = s[:, None] if side == 0 else s[None, :]
        if side == 0:
            ad = ad * s
        else:
            bd = bd * s
    return ad @ bd


def _rel(torch, got, ref):
    ref = ref.double()
    return (torch.linalg.norm(got.double() - ref) / max(torch.linalg.norm(ref).item(), 1e-300)).item()


def _check(torch, got, ref, out_dtype, K, what="", fast=False):
    assert not torch.isnan(got).any(), f"{what}: NaN left in the output"
    err, tol = _rel(torch, got, ref), tolerance(out_dtype, K, fast)
    assert err < tol, f"{what}: relative error {err:.3g} >= {tol:.3g}"
    return err


SHAPES = [(1, 1, 16), (7, 7, 32), (64, 64, 64), (129, 129, 144), (1000, 7, 512), (7, 1000, 512),
          (1000, 1000, 1024), (129, 3000, 16), (128, 256, 16384)]


@pytest.mark.parametrize("M,N,K", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("scaling", ["none", "number", "tensor", "rowwise"])
def test_fp8_e4m3_matches_float64(torch, M, N, K, scaling):
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, scaling, M, N)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = gemm(a, b, out, scale_a=sa, scale_b=sb)
    assert got is out
    _check(torch, out, _reference(torch, a, b, sa, sb), "bf16", K, f"{M}x{N}x{K} {scaling}")


@pytest.mark.parametrize("M,N,K,block_n", [(129, 192, 128, 192), (1000, 1000, 1008, 192), (1000, 320, 384, 256),
                                           (129, 1000, 1008, 256), (4096, 2112, 7168, None)], ids=str)
def test_fp8_per_tensor_device_scales_on_wide_tiles(torch, M, N, K, block_n):
    """One-element scale tensors on the 128 x 192 and 128 x 256 promoted tiles (and the default's
    at 4096x2112x7168): ``scale_b``'s stride-0 vector is read as one factor of every row's."""
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, "tensor", M, N)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    config = block_n and GemmConfig(block_m=128, block_n=block_n)
    assert gemm(a, b, out, scale_a=sa, scale_b=sb, config=config) is out
    _check(torch, out, _reference(torch, a, b, sa, sb), "bf16", K, f"{M}x{N}x{K} 128x{block_n}")


@pytest.mark.parametrize("scaling", ["number", "tensor", "rowwise"])
@pytest.mark.parametrize("M,N,K,out_dtype", [(1, 7, 128, "bf16"), (193, 129, 1008, "f32"), (1000, 1000, 1040, "bf16"),
                                             (385, 127, 16384, "f16")], ids=str)
def test_fp8_192_row_tiles_take_the_scales(torch, M, N, K, out_dtype, scaling):
    """Three consumers' promoted 192 x 128 tiles (the default's at 8192^3 and 4096x2112x7168)
    with a number, per-tensor device scales and row-wise vectors: partial tiles in both
    directions, a consumer with no rows, K from one k-block to 128."""
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, scaling, M, N)
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, TORCH_OUT[out_dtype]), device="cuda")
    assert gemm(a, b, out, scale_a=sa, scale_b=sb, config=GemmConfig(block_m=192, block_n=128)) is out
    _check(torch, out, _reference(torch, a, b, sa, sb), out_dtype, K, f"{M}x{N}x{K} {scaling} 192x128")


@pytest.mark.parametrize("scaling", ["none", "tensor", "rowwise"])
@pytest.mark.parametrize("K", [16, 128, 256, 384, 1040])
@pytest.mark.parametrize("block_m", [128, 192])
def test_fp8_tiles_stored_behind_the_next_first_k_block(torch, block_m, K, scaling):
    """More tiles than SMs, so a CTA stores a tile while the next one's first k-block runs
    (``GemmConfig.overlaps_store``): items of one, two, three and nine k-blocks (a partial
    one at K = 16 and 1040), ragged tiles, the plain store and the scales' epilogue."""
    M = N = 2000
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, scaling, M, N)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert gemm(a, b, out, scale_a=sa, scale_b=sb, config=GemmConfig(block_m=block_m, block_n=128)) is out
    _check(torch, out, _reference(torch, a, b, sa, sb), "bf16", K, f"{block_m}x128 K={K} {scaling}")


@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_output_dtypes(torch, fp8, out_dtype):
    M, N, K = 1000, 1500, 2048  # a partial last wave of 128-row tiles
    a, b = _operands(torch, M, N, K, fp8)
    sa, sb = _scales(torch, "rowwise", M, N)
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, TORCH_OUT[out_dtype]), device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb)
    _check(torch, out, _reference(torch, a, b, sa, sb), out_dtype, K, f"{fp8} -> {out_dtype}")


@pytest.mark.parametrize("fp8_a,fp8_b", [("e4m3", "e5m2"), ("e5m2", "e4m3")])
@pytest.mark.parametrize("scaling", ["tensor", "rowwise", "block"])
def test_mixed_fp8_operands(torch, fp8_a, fp8_b, scaling):
    """e4m3 x e5m2 (FP8 training's gradient products), against float64 and torch._scaled_mm."""
    M, N, K = 1000, 1500, 2048 + 80
    a, _ = _operands(torch, M, N, K, fp8_a)
    _, b = _operands(torch, M, N, K, fp8_b, seed=3)
    if scaling == "block":
        sa, sb = _block_scales(torch, M, N, K)
        ref, tol = _block_reference(torch, a, b, sa, sb), tolerance("bf16")
    else:
        sa, sb = _scales(torch, scaling, M, N)
        ref, tol = _reference(torch, a, b, sa, sb), tolerance("bf16", K)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb)
    assert not torch.isnan(out).any()
    err = _rel(torch, out, ref)
    assert err < tol, f"{fp8_a} x {fp8_b} {scaling}: relative error {err:.3g} >= {tol:.3g}"
    if scaling == "tensor" and K % 16 == 0:
        theirs = _scaled_mm(torch, a, b, sa, sb, torch.bfloat16, False)
        assert _rel(torch, out, theirs) < tol


def test_fp8_default_output_is_bf16(torch):
    a, b = _operands(torch, 256, 384, 512)
    got = gemm(a, b)
    assert got.dtype == torch.bfloat16 and got.shape == (256, 384)
    _check(torch, got, _reference(torch, a, b, None, None), "bf16", 512)


def test_fp8_column_major_output_swaps_the_scales(torch):
    """A column-major out runs out.T = b.T @ a.T: scale_a then scales the kernel's columns."""
    M, N, K = 300, 200, 256
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, "rowwise", M, N)
    out = torch.full((N, M), float("nan"), dtype=torch.float32, device="cuda").t()
    gemm(a, b, out, scale_a=sa, scale_b=sb)
    _check(torch, out, _reference(torch, a, b, sa, sb), "f32", K)


def test_fp8_large_k(torch):
    M, N, K = 512, 1024, 16384
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, "tensor", M, N)
    _check(torch, gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="f32"), _reference(torch, a, b, sa, sb), "f32", K)


@pytest.mark.parametrize("M", [1, 64])
def test_fp8_split_k(torch, M):
    """K slices of k-blocks of 128 fp8 elements (a plain product: split-K runs no epilogue)."""
    N, K = 4096, 14336 + 16  # a partial last k-block
    a, b = _operands(torch, M, N, K)
    got = gemm(a, b, out_dtype="f32", config=GemmConfig(block_m=64, block_n=128), split_k=3)
    _check(torch, got, _reference(torch, a, b, None, None), "f32", K)


def _plan_steps(monkeypatch):
    """The step kinds of each plan gemm builds from here on (in a fresh plan cache)."""
    import numba_hopper.matmul.api as g
    from numba_hopper.matmul import plan as _plan
    from numba_hopper.matmul import plan_cache

    steps = []

    def spy(*args):
        plan = _plan.gemm_plan(*args)
        steps.append([type(s).__name__ for s in plan.specs])
        return plan

    monkeypatch.setattr(g, "gemm_plan", spy)
    plan_cache.clear_plans()
    return steps


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("scaling", ["number", "tensor", "rowwise"])
@pytest.mark.parametrize("M", [1, 7, 64, 128])
def test_fp8_split_k_scales_in_its_reduce(torch, monkeypatch, M, scaling, out_dtype):
    """Split-K with scales (asked for: fp8 does not split on its own yet): plain K slices, then
    a reduce that applies alpha (numbers) or the scale vectors (one-element ones at stride 0),
    into a NaN-poisoned ``out=`` and a fresh output."""
    N, K = 2112, 7168
    steps = _plan_steps(monkeypatch)
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, scaling, M, N)
    ref = _reference(torch, a, b, sa, sb)
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, TORCH_OUT[out_dtype]), device="cuda")
    split = dict(config=GemmConfig(block_m=64, block_n=64), split_k=2)
    assert gemm(a, b, out, scale_a=sa, scale_b=sb, **split) is out
    fresh = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, **split)
    assert len(steps) == 2 and all(s == ["_Gemm", "_Reduce"] for s in steps), steps
    for got, what in ((out, "out="), (fresh, "fresh")):
        _check(torch, got, ref, out_dtype, K, f"{M} {scaling} -> {out_dtype}, {what}")
    assert torch.equal(out, fresh)  # one fixed-order sum
    if scaling != "number" and out_dtype == "bf16" and M % 16 == 0:  # what cuBLASLt's fp8 takes
        promoted = _scaled_mm(torch, a, b, sa, sb, torch.bfloat16, False)
        assert _rel(torch, out, promoted) < tolerance("bf16", K), (_rel(torch, out, ref), _rel(torch, promoted, ref))


def test_16_bit_split_k_scales_in_its_reduce(torch, monkeypatch):
    """A 16-bit product splits only when asked; alpha then goes to the reduce too."""
    M, N, K = 1, 4096, 8192
    steps = _plan_steps(monkeypatch)
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, alpha=0.5, config=GemmConfig(block_m=64, block_n=128), split_k=4)
    assert steps == [["_Gemm", "_Reduce"]]
    _check(torch, out, 0.5 * (a.double() @ b.double()), "bf16", 0, "bf16 alpha=0.5")  # K=0: rounding only


@pytest.mark.parametrize("fast", [False, True], ids=["promoted", "fast_accum"])
def test_fp8_stream_k(torch, fast):
    """Stream-K's k-iteration split counts k-blocks of 128 fp8 elements; its fix-up adds the
    promoted sums (or the accumulators)."""
    M, N, K = 1000, 1000, 4096
    a, b = _operands(torch, M, N, K)
    got = gemm(a, b, out_dtype="f32", config=GemmConfig(block_n=128, stream_k=True), use_fast_accum=fast)
    _check(torch, got, _reference(torch, a, b, None, None), "f32", K, fast=fast)


def test_fp8_fused_bias_gelu(torch):
    M, N, K = 500, 768, 1024
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, "rowwise", M, N)
    bias = torch.randn(N, device="cuda").to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, bias=bias, activation="gelu_tanh")
    ref = torch.nn.functional.gelu(_reference(torch, a, b, sa, sb) + bias.double()[None, :], approximate="tanh")
    _check(torch, out, ref, "bf16", K, "bias+gelu_tanh")


@pytest.mark.parametrize("M,N,K", [(1, 7, 128), (127, 129, 1040), (1000, 1000, 1024), (4096, 2304, 512)], ids=str)
@pytest.mark.parametrize("scaling", ["none", "number", "tensor", "rowwise"])
def test_fp8_ping_pong_tiles(torch, M, N, K, scaling):
    """Unpromoted fp8 in 128 x 128 ping-pong tiles (``use_fast_accum=True``'s default where they
    pay): each consumer scales and stores both halves of its tiles. One tile (the second consumer
    idle), ragged edges, CTAs with several tiles."""
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, scaling, M, N)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, use_fast_accum=True, config=GemmConfig(block_n=128, pingpong=True, stages=5))
    _check(torch, out, _reference(torch, a, b, sa, sb), "bf16", K, f"{M}x{N}x{K} {scaling}", fast=True)


def test_fp8_ping_pong_epilogues(torch):
    """The ping-pong default of a fast product (2048 x 4096: 512 tiles), with a bias and gelu_tanh,
    and with an fp8 output, its scale and amax."""
    M, N, K = 2048, 4096, 1024
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, "rowwise", M, N)
    bias = torch.randn(N, device="cuda").to(torch.bfloat16)
    ref = _reference(torch, a, b, sa, sb)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, bias=bias, activation="gelu_tanh", use_fast_accum=True)
    gelu = torch.nn.functional.gelu(ref + bias.double()[None, :], approximate="tanh")
    _check(torch, out, gelu, "bf16", K, "bias+gelu_tanh", fast=True)
    amax = torch.full((1,), float("nan"), device="cuda")
    out8 = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="e4m3", scale_out=0.25, amax_out=amax, use_fast_accum=True)
    err = _rel(torch, out8.double() * 4, ref)
    assert err < 6e-2, f"e4m3 output: relative error {err:.3g}"
    assert abs(amax.item() / ref.abs().max().item() - 1) < 1e-2, (amax.item(), ref.abs().max().item())


def test_fp8_numba_uint8_operands(torch):
    """numba arrays hold fp8 as uint8 with dtype=; a per-tensor scale as a one-element array."""
    M, N, K = 200, 300, 256
    a, b = _operands(torch, M, N, K)
    na, nb = cuda.as_cuda_array(a.view(torch.uint8)), cuda.as_cuda_array(b.view(torch.uint8))
    scale = torch.tensor([2.0], device="cuda")
    out = cuda.as_cuda_array(torch.full((M, N), float("nan"), device="cuda"))
    gemm(na, nb, out, scale_b=cuda.as_cuda_array(scale), dtype="e4m3")
    _check(torch, torch.as_tensor(out, device="cuda"), _reference(torch, a, b, None, scale), "f32", K)


def _scaled_mm(torch, a, b, sa, sb, out_dtype, fast_accum):
    """torch._scaled_mm with its scale shapes: per-tensor 0-d, row-wise (M, 1) and (1, N)."""
    if sa.dim() == 1:
        sa, sb = sa[:, None].contiguous(), sb[None, :].contiguous()
    try:
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=fast_accum)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm refuses this: {e}")


@pytest.mark.parametrize("scaling", ["tensor", "rowwise"])
@pytest.mark.parametrize("M,N,K", [(128, 7168, 2048), (1024, 2112, 7168), (2048, 1536, 4096)], ids=str)
def test_fp8_matches_torch_scaled_mm(torch, M, N, K, scaling):
    """Like with like, each against float64: the default (promoted) against cuBLASLt's default
    (promoted too), ``use_fast_accum=True`` against cuBLASLt's: at most 1.5 times its error
    (f32 outputs, where the accumulation's error is not hidden by the output's rounding)."""
    a, b = _operands(torch, M, N, K)
    sa, sb = _scales(torch, scaling, M, N)
    ref = _reference(torch, a, b, sa, sb)
    for fast in (False, True):
        ours = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="f32", use_fast_accum=fast)
        e_ours = _check(torch, ours, ref, "f32", K, f"ours, use_fast_accum={fast}", fast)
        e_theirs = _rel(torch, _scaled_mm(torch, a, b, sa, sb, torch.float32, fast), ref)
        assert e_ours < 1.5 * e_theirs + 1e-6, (fast, e_ours, e_theirs)


# --- block-wise scales (1 x 128 for A, 128 x 128 for B), promoted every k-block -----------------

def _block_scales(torch, M, N, K, layout="torch", seed=2):
    """Positive block-wise ``(scale_a, scale_b)``: (M, ceil(K/128)) and (ceil(K/128), ceil(N/128)),
    in ``torch._scaled_mm``'s strides ((1, M) and (1, K/128)) or row-major ("rows")."""
    kb, nb = -(-K // 128), -(-N // 128)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "torch":
        return ((torch.rand(kb, M, generator=gen, device="cuda") + 0.5).t(),
                (torch.rand(nb, kb, generator=gen, device="cuda") + 0.5).t())
    return (torch.rand(M, kb, generator=gen, device="cuda") + 0.5,
            torch.rand(kb, nb, generator=gen, device="cuda") + 0.5)


def contrast_column_blocks(torch, sb):
    """Multiply B's block-wise scales (any leading dimensions, then K blocks, N blocks) in
    place by 4 and 1/4 on alternate 128-column blocks: neighbouring blocks 16x apart, so a
    column scaled with its neighbour's block fails any bound. Returns ``sb``."""
    factors = torch.tensor([4.0, 0.25], device=sb.device).repeat((sb.shape[-1] + 1) // 2)[:sb.shape[-1]]
    return sb.mul_(factors)


def _block_reference(torch, a, b, sa, sb):
    """float64 of the dequantized operands, each scale spread over its block."""
    K, N = b.shape
    sa_full = sa.double().repeat_interleave(128, 1)[:, :K]
    sb_full = sb.double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
    return (a.double() * sa_full) @ (b.double() * sb_full)


def _check_block(torch, got, ref, out_dtype, what):
    assert not torch.isnan(got).any(), f"{what}: NaN left in the output"
    err, tol = _rel(torch, got, ref), tolerance(out_dtype)
    assert err < tol, f"{what}: relative error {err:.3g} >= {tol:.3g}"
    return err


@pytest.mark.parametrize("M,N,K", SHAPES, ids=lambda v: str(v))
def test_fp8_block_wise_matches_float64(torch, M, N, K):
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert gemm(a, b, out, scale_a=sa, scale_b=sb) is out
    _check_block(torch, out, _block_reference(torch, a, b, sa, sb), "bf16", f"{M}x{N}x{K}")


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 64), (64, 128), (64, 64), (128, 192), (64, 192),
                                             (128, 256), (192, 128), (192, 64)])
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_fp8_block_wise_tiles(torch, block_m, block_n, out_dtype):
    """Every tile a block-wise product runs on, with partial tiles and a partial last k-block;
    the scales row-major (DeepGEMM's scale_b orientation transposed)."""
    M, N, K = 1000, 1500, 2048 + 80
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K, layout="rows")
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, TORCH_OUT[out_dtype]), device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, config=GemmConfig(block_m=block_m, block_n=block_n))
    _check_block(torch, out, _block_reference(torch, a, b, sa, sb), out_dtype, f"{block_m}x{block_n}")


@pytest.mark.parametrize("M,N,K", [(1000, 1500, 2048 + 80), (129, 384, 7 * 128), (4096, 4096, 7168)], ids=str)
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_fp8_block_wise_paired_ring_of_six(torch, M, N, K, out_dtype):
    """Paired 128 x 128 tiles in a six-slot ring with one output buffer per consumer (the
    default at 4096x4096x7168): pairs that wrap around the ring, an odd k-block count, a
    partial last k-block."""
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, TORCH_OUT[out_dtype]), device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, config=GemmConfig(block_n=128, stages=6, epi_buffers=1))
    _check_block(torch, out, _block_reference(torch, a, b, sa, sb), out_dtype, f"{M}x{N}x{K}")


# 192- and 256-wide tiles span two of B's 128-column scale blocks: a 192-wide tile at n0 = 0
# mod 384 takes the next block from its column 128 on, one at 192 mod 384 from its column 64
# on, a 256-wide one from its column 128 on; past B's last block (N = 192 + 1..64, 1000, 320)
# their padding columns take the last one. Ragged M.
@pytest.mark.parametrize("M,N,K", [(129, 192, 128), (1000, 320, 384), (129, 384, 1008), (1000, 576, 128),
                                   (129, 1000, 384), (1000, 1000, 1008), (64, 200, 384)], ids=str)
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("block_n", [192, 256])
def test_fp8_block_wise_wide_tiles(torch, M, N, K, out_dtype, block_n):
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    contrast_column_blocks(torch, sb)
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, TORCH_OUT[out_dtype]), device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, config=GemmConfig(block_m=128, block_n=block_n))
    _check_block(torch, out, _block_reference(torch, a, b, sa, sb), out_dtype, f"{M}x{N}x{K} 128x{block_n}")


@pytest.mark.parametrize("fp8,out_dtype", [("e4m3", "f16"), ("e5m2", "bf16"), ("e5m2", "f32")])
def test_fp8_block_wise_dtypes(torch, fp8, out_dtype):
    M, N, K = 512, 640, 1024
    a, b = _operands(torch, M, N, K, fp8)
    sa, sb = _block_scales(torch, M, N, K)
    got = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    _check_block(torch, got, _block_reference(torch, a, b, sa, sb), out_dtype, f"{fp8} -> {out_dtype}")


@pytest.mark.parametrize("scaling", ["none", "tensor", "rowwise"])
def test_fp8_lone_consumer_promotes_in_runs(torch, scaling):
    """64-row promoted tiles (one consumer, runs of ``promotion_run`` = 16 k-blocks) over items
    of no run, one and eight runs, with none to seven last pairs and a last lone k-block or not,
    ragged K and ragged tiles, against float64 with an f32 output, NaN-poisoned: within the
    promoted bound, which does not grow with K (K = 16384)."""
    M, N = 129, 300
    config = GemmConfig(block_m=64, block_n=128, a_major="K", b_major="K")
    for K in (16, 256, 384, 512, 640, 768, 944, 1024, 1152, 1408, 2048 + 1920, 16384):
        a, b = _operands(torch, M, N, K)
        sa, sb = _scales(torch, scaling, M, N)
        out = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
        gemm(a, b, out, scale_a=sa, scale_b=sb, config=config)
        _check(torch, out, _reference(torch, a, b, sa, sb), "f32", K, f"{M}x{N}x{K} {scaling}")


@pytest.mark.parametrize("scaling", ["none", "tensor", "rowwise", "blockwise"])
def test_fp8_promotion_beats_the_fp8_accumulator(torch, scaling):
    """The same product promoted (the default; block-wise with unit scales) and with
    ``use_fast_accum=True`` (f32 output, K = 16384): the promoted one is within its
    K-independent bound, and closer to float64."""
    M, N, K = 256, 512, 16384
    a, b = _operands(torch, M, N, K)
    ref = a.double() @ b.double()
    kb, nb = K // 128, N // 128
    sa, sb = {"blockwise": (torch.ones(M, kb, device="cuda"), torch.ones(kb, nb, device="cuda")),
              "rowwise": (torch.ones(M, device="cuda"), torch.ones(N, device="cuda")),
              "tensor": (torch.ones((), device="cuda"), torch.ones((), device="cuda")), "none": (None, None)}[scaling]
    promoted = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="f32")
    e_promoted = _rel(torch, promoted, ref)
    assert e_promoted < tolerance("f32") - ROUNDING["f32"], e_promoted
    if scaling != "blockwise":  # (block-wise products always promote)
        e_fast = _rel(torch, gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="f32", use_fast_accum=True), ref)
        assert e_promoted < e_fast, (e_promoted, e_fast)


def test_fp8_block_wise_scales_are_read_per_call(torch):
    """Later calls of one layout (a cached plan) read their own operands and scales, into
    fresh outputs: nothing of the first call's is reused."""
    M, N, K = 384, 768, 1536
    for seed in range(3):
        a, b = _operands(torch, M, N, K, seed=seed)
        sa, sb = _block_scales(torch, M, N, K, seed=10 + seed)
        _check_block(torch, gemm(a, b, scale_a=sa, scale_b=sb), _block_reference(torch, a, b, sa, sb), "bf16",
                     f"call {seed}")


def test_fp8_block_wise_with_fused_epilogue(torch):
    M, N, K = 500, 768, 1024
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    col = torch.rand(N, device="cuda") + 0.5
    bias = torch.randn(N, device="cuda").to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, scale_a=sa, scale_b=sb, col_scale=col, bias=bias, activation="silu")
    ref = torch.nn.functional.silu(_block_reference(torch, a, b, sa, sb) * col.double() + bias.double())
    _check_block(torch, out, ref, "bf16", "col_scale+bias+silu")


def test_fp8_block_wise_numba_arrays(torch):
    M, N, K = 200, 300, 384
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    out = cuda.as_cuda_array(torch.full((M, N), float("nan"), device="cuda"))
    gemm(cuda.as_cuda_array(a.view(torch.uint8)), cuda.as_cuda_array(b.view(torch.uint8)), out,
         scale_a=cuda.as_cuda_array(sa), scale_b=cuda.as_cuda_array(sb), dtype="e4m3")
    _check_block(torch, torch.as_tensor(out, device="cuda"), _block_reference(torch, a, b, sa, sb), "f32", "numba")


@pytest.mark.parametrize("M,N,K", [(128, 7168, 2048), (1024, 2112, 7168), (2048, 1536, 4096)], ids=str)
def test_fp8_block_wise_matches_torch_scaled_mm(torch, M, N, K):
    """Against cuBLASLt's block-wise product (promoted too): both within the bound of float64,
    and of each other."""
    a, b = _operands(torch, M, N, K)
    sa, sb = _block_scales(torch, M, N, K)
    ref = _block_reference(torch, a, b, sa, sb)
    ours = gemm(a, b, scale_a=sa, scale_b=sb)
    try:
        theirs = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm refuses block-wise scales here: {e}")
    e_ours = _check_block(torch, ours, ref, "bf16", "ours")
    e_theirs = _rel(torch, theirs, ref)
    assert _rel(torch, ours, theirs) < tolerance("bf16"), (e_ours, e_theirs)


@pytest.mark.parametrize("scaling", ["block", "rowwise"])
@pytest.mark.serial
def test_fp8_scaled_calls_never_wait_for_the_gpu(torch, scaling):
    """A scaled call on a cached layout (its fast path: the scales' layouts) returns while the
    stream is still busy, and reads its own operands and scales."""
    import time

    M, N, K = 512, 1024, 1024

    def call_args(seed):
        a, b = _operands(torch, M, N, K, seed=seed)
        s = _block_scales(torch, M, N, K, seed=seed) if scaling == "block" else _scales(torch, "rowwise", M, N, seed)
        return a, b, s

    a, b, s = call_args(0)
    gemm(a, b, scale_a=s[0], scale_b=s[1])  # the plan exists; the arrays below are new to it
    a, b, s = call_args(1)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning on the current stream
    gate = torch.cuda.Event()
    gate.record()
    start = time.perf_counter()
    out = gemm(a, b, scale_a=s[0], scale_b=s[1])
    host = time.perf_counter() - start
    assert not gate.query(), "gemm returned only after the queued sleep had finished"
    assert host < 0.05, host
    torch.cuda.synchronize()
    if scaling == "block":
        _check_block(torch, out, _block_reference(torch, a, b, *s), "bf16", "block, second call")
    else:
        _check(torch, out, _reference(torch, a, b, *s), "bf16", K, "rowwise, second call")
