"""The edges torch accepts, on a Hopper GPU, against float64 with outputs poisoned by NaN:

- a 1-D bias is one value per column whatever M and N are (a square output included), per
  row with ``bias_dim=0`` or an (M, 1) bias, in ``numba_hopper.gemm`` and ``numba_hopper.torch``;
- ``numba_hopper.bmm`` of operands TMA cannot address: aligned copies, one launch per
  operand for the whole batch, and an output computed in scratch and copied out;
- ``K == 0`` with every epilogue: the epilogue of a zero product.
"""

import numpy as np
import pytest
from numba import cuda

import numba_hopper
from numba_hopper.matmul import clear_plans, plan as _plan

pytestmark = pytest.mark.gpu

ACT = {None: lambda x: x, "sigmoid": lambda x: x.sigmoid(), "silu": lambda x: x * x.sigmoid(),
       "gelu": lambda x: 0.5 * x * (1 + (x / 2 ** 0.5).erf())}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def gen(torch):
    g = torch.Generator(device="cuda")
    g.manual_seed(np.random.SeedSequence().entropy % 2**63)
    return g


def _randn(torch, gen, *shape, dtype="bfloat16"):
    return torch.randn(*shape, generator=gen, device="cuda").to(getattr(torch, dtype))


def _empty(torch, *shape):
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16)


def _nan(torch, *shape, dtype="bfloat16"):
    return torch.full(shape, float("nan"), device="cuda", dtype=getattr(torch, dtype))


def _err(torch, got, ref, scale=None):
    """Relative norm error against float64 (absolute where the reference is 0), relative to the
    norm of ``scale`` (default: ``ref``); no NaN left."""
    assert not torch.isnan(got).any(), "unwritten (NaN) output elements"
    diff, norm = (got.double() - ref).norm().item(), (ref if scale is None else scale).norm().item()
    return diff / norm if norm else diff


# --- bias like torch ---------------------------------------------------------------------------


@pytest.mark.parametrize("M,N,K", [(256, 256, 64), (4096, 4096, 4096), (1, 1, 16), (129, 129, 77)])
def test_a_1d_bias_on_a_square_output_is_one_value_per_column(torch, gen, M, N, K):
    """A Llama q_proj at 4096 tokens: x (4096, 4096) @ W.T + b, M == N, as F.linear computes it."""
    x, w, bias = _randn(torch, gen, M, K), _randn(torch, gen, N, K), _randn(torch, gen, N)
    got = numba_hopper.gemm(x, w.t(), bias=bias)
    ref = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    assert _err(torch, got, ref) < 1e-2
    out = _nan(torch, M, N)
    numba_hopper.gemm(x, w.t(), out=out, bias=bias, activation="gelu")
    # relative to the pre-activation: at 1 x 1 a very negative one's gelu is 0 in f32, as torch's
    # (1 + erf rounds to 0), against a float64 reference of about -1e-11
    assert _err(torch, out, ACT["gelu"](ref), scale=ref) < 1e-2


@pytest.mark.parametrize("form", ["bias_dim=0", "(M, 1)", "(M, 1) strided", "(1, N)", "bias_dim=1"])
@pytest.mark.parametrize("out_major", ["R", "C"])
def test_bias_per_row_is_asked_for(torch, gen, form, out_major):
    M = N = 200
    a, b = _randn(torch, gen, M, 96), _randn(torch, gen, 96, N)
    v = _randn(torch, gen, M, dtype="float32")
    bias, kw, per_row = {"bias_dim=0": (v, {"bias_dim": 0}, True), "(M, 1)": (v[:, None], {}, True),
                         "(M, 1) strided": (_randn(torch, gen, M, 3, dtype="float32")[:, 1:2], {}, True),
                         "(1, N)": (v[None, :], {}, False), "bias_dim=1": (v, {"bias_dim": 1}, False)}[form]
    out = _nan(torch, M, N) if out_major == "R" else _nan(torch, N, M).t()
    numba_hopper.gemm(a, b, out=out, bias=bias, **kw)
    vec = bias.double().reshape(-1)
    ref = a.double() @ b.double() + (vec[:, None] if per_row else vec[None, :])
    assert _err(torch, out, ref) < 1e-2


def test_torch_layer_bias_like_torch(torch, gen):
    """nht.linear at as many tokens as features (M == N), nht.addmm with an (M, 1) input, and the
    custom operator with an (M, 1) bias: values and gradients against float64."""
    nht = pytest.importorskip("numba_hopper.torch")
    x = _randn(torch, gen, 512, 384).requires_grad_()
    w = (_randn(torch, gen, 512, 384) / 20).requires_grad_()
    b = _randn(torch, gen, 512).requires_grad_()
    y = nht.linear(x, w, b, activation="silu")
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = torch.nn.functional.silu(torch.nn.functional.linear(*leaves))
    assert _err(torch, y, ref) < 1e-2
    g = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(ref, leaves, g.double())):
        assert _err(torch, got, want) < 2e-2
    m1, m2, inp = _randn(torch, gen, 300, 64), _randn(torch, gen, 64, 300), _randn(torch, gen, 300, 1)
    got = nht.addmm(inp, m1, m2, beta=0.5, alpha=2.0)
    assert _err(torch, got, torch.addmm(inp.double(), m1.double(), m2.double(), beta=0.5, alpha=2.0)) < 1e-2
    col = _randn(torch, gen, 300, 1, dtype="float32").requires_grad_()
    out = torch.ops.numba_hopper.gemm(m1, m2, bias=col)
    (dcol,) = torch.autograd.grad(out, col, torch.ones_like(out))
    assert dcol.shape == (300, 1) and torch.allclose(dcol, torch.full_like(dcol, 300.0))


# --- bmm of operands TMA cannot address --------------------------------------------------------


def _count_copies(monkeypatch):
    """The shapes of the copies prepared from here on (each plan built anew)."""
    clear_plans()
    copies = []
    real = _plan.prepare_copy
    monkeypatch.setattr(_plan, "prepare_copy", lambda src, dst: copies.append(src.shape) or real(src, dst))
    return copies


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bmm_copies_operands_tma_cannot_address(torch, gen, monkeypatch, dtype):
    """torch's OpInfo bmm sample (10, 5, 10) x (10, 10, 5): rows of 20 and 10 bytes, an output row
    of 10: three copies, each one launch for the whole batch."""
    copies = _count_copies(monkeypatch)
    a, b = _randn(torch, gen, 10, 5, 10, dtype=dtype), _randn(torch, gen, 10, 10, 5, dtype=dtype)
    got = numba_hopper.bmm(a, b)
    assert got.shape == (10, 5, 5) and got.dtype == a.dtype
    assert _err(torch, got, a.double() @ b.double()) < 1e-2
    assert sorted(copies) == sorted([(10, 5, 10), (10, 10, 5), (10, 5, 5)])


@pytest.mark.parametrize("case", ["misaligned base", "batch stride", "transposed items", "column of a 3-D",
                                  "broadcast", "strided out", "column-major out", "K = 1"])
def test_bmm_layouts(torch, gen, case):
    B, M, N, K = 6, 33, 40, 72
    a, b = _randn(torch, gen, B, M, K), _randn(torch, gen, B, K, N)
    out = None
    if case == "misaligned base":
        a = _randn(torch, gen, B * M * K + 1)[1:].view(B, M, K)
    elif case == "batch stride":
        a = _randn(torch, gen, B, M * K + 3)[:, :M * K].view(B, M, K)
    elif case == "transposed items":
        b = _randn(torch, gen, B, N, K + 1)[:, :, :K].transpose(1, 2)
    elif case == "column of a 3-D":
        a = _randn(torch, gen, B, M, 2 * K)[:, :, ::2]  # unit stride along neither side
    elif case == "broadcast":
        b = _randn(torch, gen, 1, K, N + 3)[:, :, :N].expand(B, K, N)
    elif case == "strided out":
        out = _nan(torch, B, M, N + 5)[:, :, 2:N + 2]
    elif case == "column-major out":
        out = _nan(torch, B, N, M, dtype="float32").transpose(1, 2)
    else:
        a, b = _randn(torch, gen, B, M, 1), _randn(torch, gen, B, 1, N)
    if out is not None:
        out.fill_(float("nan"))
        assert numba_hopper.bmm(a, b, out=out) is out
    else:
        out = numba_hopper.bmm(a, b)
    assert _err(torch, out, a.double() @ b.double()) < 1e-2


def test_bmm_of_more_matrices_than_the_grid_has_z_blocks(torch, gen, monkeypatch):
    """70000 items: the copies' grid stops at 65535 in z and its blocks stride over the rest."""
    copies = _count_copies(monkeypatch)
    a, b = _randn(torch, gen, 70000, 3, 8), _randn(torch, gen, 70000, 8, 3)  # b rows and out rows: 6 bytes
    got = numba_hopper.bmm(a, b)
    assert _err(torch, got, a.double() @ b.double()) < 1e-2
    assert len(copies) == 2


def test_bmm_k0_zero_fills(torch):
    a, b = _empty(torch, 4, 7, 0), _empty(torch, 4, 0, 9)
    for out in (_nan(torch, 4, 7, 9), _nan(torch, 4, 7, 18)[:, :, ::2], _nan(torch, 4, 9, 7).transpose(1, 2)):
        numba_hopper.bmm(a, b, out=out)
        assert (out == 0).all()


# --- K == 0: the epilogue of a zero product ----------------------------------------------------


@cuda.jit(device=True)
def _plus_column(value, row, col, v):
    return value + v[col]


def _k0_case(torch, gen, name, M, N):
    """``(keywords, reference(float64 of (M, N)), aux reference or None)`` of an epilogue at K == 0."""
    c, bias, rows = _randn(torch, gen, M, N), _randn(torch, gen, N, dtype="float32"), _randn(torch, gen, M, 1)
    z = torch.zeros(M, N, dtype=torch.float64, device="cuda")
    cases = {
        "alpha, beta, c": ({"alpha": 2.0, "beta": 0.5, "c": c}, 0.5 * c.double()),
        "bias": ({"bias": bias}, z + bias.double()),
        "bias per row": ({"bias": rows}, z + rows.double()),
        "sigmoid": ({"activation": "sigmoid"}, z + 0.5),
        "c, bias, gelu": ({"beta": -1.0, "c": c, "bias": bias, "activation": "gelu"},
                          ACT["gelu"](bias.double() - c.double())),
        "row and col scales": ({"row_scale": rows[:, 0].float(), "col_scale": bias, "bias": bias}, z + bias.double()),
        "user epilogue": ({"epilogue": _plus_column, "epilogue_args": (bias,), "activation": "silu"},
                          z + bias.double()),
    }
    return cases[name]


@pytest.mark.parametrize("name", ["alpha, beta, c", "bias", "bias per row", "sigmoid", "c, bias, gelu",
                                  "row and col scales", "user epilogue"])
@pytest.mark.parametrize("M,N,out_major", [(7, 96, "R"), (129, 77, "R"), (64, 200, "C")])
def test_k0_runs_the_epilogue_of_a_zero_product(torch, gen, name, M, N, out_major):
    kw, ref = _k0_case(torch, gen, name, M, N)
    a, b = _empty(torch, M, 0), _empty(torch, 0, N)
    out = _nan(torch, M, N, dtype="float32") if out_major == "R" else _nan(torch, N, M, dtype="float32").t()
    numba_hopper.gemm(a, b, out=out, **kw)
    assert _err(torch, out, ref) < 1e-3


def test_k0_aux_out_amax_and_fp8_output(torch, gen):
    M, N = 100, 64
    c, bias = _randn(torch, gen, M, N), _randn(torch, gen, N, dtype="float32")
    a, b = _empty(torch, M, 0), _empty(torch, 0, N)
    pre = _nan(torch, M, N, dtype="float32")
    got = numba_hopper.gemm(a, b, c=c, beta=1.0, bias=bias, activation="silu", aux_out=pre)
    z = c.double() + bias.double()
    assert _err(torch, pre, z) < 1e-6 and _err(torch, got, ACT["silu"](z)) < 1e-2
    if hasattr(torch, "float8_e4m3fn"):
        amax = torch.full((1,), 1e30, device="cuda")
        out8 = numba_hopper.gemm(a, b, c=c, beta=1.0, bias=bias, out_dtype="e4m3", scale_out=0.5, amax_out=amax)
        assert abs(amax.item() - z.abs().max().item()) <= 1e-5 * z.abs().max().item()
        assert _err(torch, out8.double(), (0.5 * z).clamp(-448, 448)) < 2.0 ** -4


def test_k0_gated_and_fp8_inputs(torch, gen):
    M, N = 33, 128
    a = _empty(torch, M, 0)
    w_gate, w_up = _empty(torch, N, 0), _empty(torch, N, 0)
    gated = numba_hopper.gemm(a, w_gate.t(), up=w_up.t(), activation="sigmoid", out=_nan(torch, M, N))
    assert (gated == 0).all()  # sigmoid(0) * 0
    if not hasattr(torch, "float8_e4m3fn"):
        return
    a8 = torch.empty(M, 0, device="cuda", dtype=torch.float8_e4m3fn)
    b8 = torch.empty(N, 0, device="cuda", dtype=torch.float8_e5m2).t()
    bias = _randn(torch, gen, N, dtype="float32")
    for scales in [(2.0, 0.5), (_randn(torch, gen, M, dtype="float32"), _randn(torch, gen, N, dtype="float32")),
                   (torch.ones(M, 0, device="cuda"), torch.ones(0, 1, device="cuda"))]:  # block-wise: no blocks
        out = numba_hopper.gemm(a8, b8, scale_a=scales[0], scale_b=scales[1], bias=bias, out_dtype="f32")
        assert _err(torch, out, bias.double().expand(M, N)) < 1e-6
        assert (numba_hopper.gemm(a8, b8, scale_a=scales[0], scale_b=scales[1]) == 0).all()
