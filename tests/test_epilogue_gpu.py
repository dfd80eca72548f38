"""Fused GEMM epilogues on the H100 against float64 torch references, outputs poisoned with NaN."""

import numpy as np
import pytest
from numba import cuda

from numba_hopper import gemm
from numba_hopper.kernels.gemm_config import GemmConfig

pytestmark = pytest.mark.gpu

TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
# bf16/f16 outputs round to 8/11 bits; f32 outputs see the hardware tanh (about 2^-11).
TOL = {"bf16": 1e-2, "f16": 3e-3, "f32": 2e-3}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@cuda.jit(device=True)
def _scale_cols(v, row, col, scale, shift):
    return v * scale[col] + shift * row


def _rand(torch, gen, shape, dtype="f32", major="R"):
    tdt = getattr(torch, TORCH_DTYPES[dtype])
    if major == "R" or len(shape) == 1:
        return torch.randn(*shape, generator=gen, device="cuda").to(tdt)
    return torch.randn(*shape[::-1], generator=gen, device="cuda").to(tdt).t()


def _reference(torch, a, b, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None,
               row_scale=None, col_scale=None, epilogue_args=None, **_):
    F = torch.nn.functional
    v = a.double() @ b.double()
    if row_scale is not None:
        v = v * row_scale.double()[:, None]
    if col_scale is not None:
        v = v * col_scale.double()[None, :]
    v = alpha * v
    if c is not None and beta != 0.0:
        v = v + beta * c.double()
    if bias is not None:
        v = v + (bias.double()[:, None] if bias_dim == 0 else bias.double()[None, :])
    pre = v
    act = {None: lambda x: x, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
           "silu": F.silu, "sigmoid": torch.sigmoid}[activation]
    v = act(v)
    if epilogue_args is not None:
        scale, shift = epilogue_args
        rows = torch.arange(v.shape[0], device="cuda", dtype=torch.float64)[:, None]
        v = v * scale.double()[None, :] + shift * rows
    return v, pre


def _rel(torch, got, ref):
    assert torch.isfinite(got).all(), "unwritten (NaN) output elements"
    return ((got.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()


def _check(torch, M, N, K, layout="RR", out_major="R", out_dtype="bf16", c_major="R", c_dtype="bf16",
           in_place=False, aux_dtype=None, **opts):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(np.random.SeedSequence().entropy % 2**63)
    a = _rand(torch, gen, (M, K), "bf16", layout[0])
    b = _rand(torch, gen, (K, N), "bf16", layout[1])
    if opts.pop("with_c", False):
        opts["c"] = _rand(torch, gen, (M, N), c_dtype, c_major)
    if "bias" in opts:
        opts["bias"] = _rand(torch, gen, ((M, N)[opts.get("bias_dim", 1)],), opts["bias"])
    for name, n in (("row_scale", M), ("col_scale", N)):
        if opts.get(name):
            opts[name] = torch.rand(n, generator=gen, device="cuda") + 0.5
    if opts.get("epilogue"):
        opts["epilogue_args"] = (torch.rand(N, generator=gen, device="cuda"), 0.001)
    ref, pre = _reference(torch, a, b, **opts)
    if in_place:
        out = opts["c"]
    else:
        out = _rand(torch, gen, (M, N), out_dtype, out_major).fill_(float("nan"))
    if aux_dtype:
        opts["aux_out"] = _rand(torch, gen, (M, N), aux_dtype).fill_(float("nan"))
    assert gemm(a, b, out=out, **opts) is out
    torch.cuda.synchronize()
    err = _rel(torch, out, ref)
    tol = TOL[{v: k for k, v in TORCH_DTYPES.items()}[str(out.dtype).split(".")[1]]]
    assert err < tol, (M, N, K, layout, out_major, opts.keys(), err)
    if aux_dtype:
        assert _rel(torch, opts["aux_out"], pre) < TOL[aux_dtype]


ALONE = {
    "alpha": dict(alpha=-2.5),
    "beta*c": dict(beta=0.5, with_c=True),
    "bias per column": dict(bias="bf16"),
    "bias per row": dict(bias="f32", bias_dim=0),
    "relu": dict(activation="relu"),
    "gelu": dict(activation="gelu"),
    "gelu_tanh": dict(activation="gelu_tanh"),
    "silu": dict(activation="silu"),
    "sigmoid": dict(activation="sigmoid"),
    "row_scale": dict(row_scale=True),
    "col_scale": dict(col_scale=True),
    "user epilogue": dict(epilogue=_scale_cols),
}


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("name", list(ALONE))
def test_each_option_alone(torch, name, out_dtype):
    _check(torch, 333, 520, 270, out_dtype=out_dtype, **ALONE[name])


@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("aux_dtype", ["bf16", "f32"])
def test_aux_out_holds_the_pre_activation_value(torch, out_dtype, aux_dtype):
    _check(torch, 300, 264, 200, out_dtype=out_dtype, aux_dtype=aux_dtype, bias="f16", activation="gelu",
           beta=1.0, with_c=True)


@pytest.mark.parametrize("M,N,K", [(129, 257, 77), (1000, 1000, 1000), (64, 64, 64), (1, 300, 77), (4096, 4096, 832)])
def test_bias_gelu_residual_ragged(torch, M, N, K):
    _check(torch, M, N, K, bias="bf16", bias_dim=1, activation="gelu", beta=1.0, with_c=True)


@pytest.mark.parametrize("acc_chains", [1, 4])
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("M,N,K", [(37, 520, 270), (64, 4096, 640)])
def test_64_row_tiles_with_every_option(torch, M, N, K, out_dtype, acc_chains):
    """M <= 64 runs 64-row tiles (one consumer warpgroup): every part of the epilogue there,
    with the heuristic's tile and with 64 x 64 tiles of separate accumulators."""
    config = GemmConfig(block_m=64, block_n=64, stages=4, acc_chains=4) if acc_chains > 1 else None
    _check(torch, M, N, K, out_dtype=out_dtype, alpha=0.5, beta=-1.0, with_c=True, bias="f32", bias_dim=0,
           activation="silu", row_scale=True, col_scale=True, aux_dtype="bf16", epilogue=_scale_cols, config=config)


@pytest.mark.parametrize("cluster_m,epi_buffers", [(1, 2), (2, 2), (1, 1)])
def test_192_row_tiles_with_bias_gelu_residual(torch, cluster_m, epi_buffers):
    _check(torch, 1000, 1040, 520, bias="bf16", activation="gelu_tanh", beta=1.0, with_c=True, aux_dtype="bf16",
           config=GemmConfig(block_m=192, block_n=128, stages=3, cluster_m=cluster_m, epi_buffers=epi_buffers))


@pytest.mark.parametrize("layout", ["RR", "CC"])
@pytest.mark.parametrize("out_major", ["R", "C"])
@pytest.mark.parametrize("c_major", ["R", "C"])
def test_alpha_beta_c_layouts(torch, layout, out_major, c_major):
    _check(torch, 257, 190, 300, layout=layout, out_major=out_major, c_major=c_major, alpha=0.75, beta=-1.5,
           with_c=True, bias="f32", row_scale=True, col_scale=True, epilogue=_scale_cols)


@pytest.mark.parametrize("out_dtype,c_dtype", [("bf16", "f32"), ("f32", "bf16"), ("f16", "f16"), ("f32", "f32")])
def test_c_dtypes(torch, out_dtype, c_dtype):
    _check(torch, 200, 330, 150, out_dtype=out_dtype, c_dtype=c_dtype, beta=2.0, with_c=True)


@pytest.mark.parametrize("out_major", ["R", "C"])
def test_in_place_update_of_c(torch, out_major):
    _check(torch, 1000, 777, 300, c_major=out_major, in_place=True, alpha=0.5, beta=1.0, with_c=True,
           activation="silu")


def test_user_epilogue_many_tiles_and_kernel_reuse(torch):
    # Persistent CTAs cross tiles with C sub-tiles prefetched across tile boundaries; the
    # second call reuses the cached plan with new data.
    for _ in range(2):
        _check(torch, 2048, 2048, 13 * 64 - 5, beta=1.0, with_c=True, epilogue=_scale_cols, bias="bf16",
               bias_dim=0)


def test_beta_zero_does_not_read_c(torch):
    a = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 80, device="cuda", dtype=torch.bfloat16)
    c = torch.full((100, 80), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = gemm(a, b, c=c, beta=0.0, activation="relu")
    assert _rel(torch, out, torch.relu(a.double() @ b.double())) < 1e-2
