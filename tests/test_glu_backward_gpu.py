"""A gated unit's backward in a GEMM's epilogue (``gemm_glu_backward``) on the H200 against float64,
outputs poisoned with NaN: ragged sizes, both dtypes, operand layouts, K == 0."""

import pytest

from numba_hopper import gemm_glu_backward

pytestmark = pytest.mark.gpu

TOL = {"bf16": 1e-2, "f16": 3e-3}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def _case(torch, M, N, K, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    dy = torch.randn(M, K, generator=gen, device="cuda").to(tdt)
    w = torch.randn(K, N, generator=gen, device="cuda").div(max(K, 1) ** 0.5).to(tdt)
    gate = torch.randn(M, N, generator=gen, device="cuda").mul(2).to(tdt)
    up = torch.randn(M, N, generator=gen, device="cuda").to(tdt)
    return dy, w, gate, up


def _reference(torch, dy, w, gate, up):
    """PyTorch's own gradients of ``silu(gate) * up`` at ``dh = dy @ w``, in float64."""
    g, u = gate.double().requires_grad_(), up.double().requires_grad_()
    (torch.nn.functional.silu(g) * u).backward(dy.double() @ w.double())
    return g.grad, u.grad


@pytest.mark.parametrize("M,N,K", [(1, 64, 64), (7, 200, 136), (127, 384, 1000), (129, 1000, 520),
                                   (1000, 256, 7), (4096, 5632, 2048)])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gradients_of_both_products(torch, M, N, K, dtype):
    dy, w, gate, up = _case(torch, M, N, K, dtype)
    d_gate, d_up = (torch.full_like(gate, float("nan")) for _ in range(2))
    gemm_glu_backward(dy, w, gate, up, d_gate, d_up)
    fresh = gemm_glu_backward(dy, w, gate, up, config="sustained")
    ref_g, ref_u = _reference(torch, dy, w, gate, up)
    for g, u in ((d_gate, d_up), fresh):
        assert _rel(g, ref_g) < TOL[dtype] and _rel(u, ref_u) < TOL[dtype]


@pytest.mark.parametrize("a_major,b_major", [("M", "N"), ("K", "K"), ("M", "K")])
def test_operand_layouts(torch, a_major, b_major):
    dy, w, gate, up = _case(torch, 300, 264, 200, "bf16", seed=1)
    a = dy if a_major == "K" else dy.t().contiguous().t()
    b = w if b_major == "N" else w.t().contiguous().t()
    ref_g, ref_u = _reference(torch, dy, w, gate, up)
    d_gate, d_up = gemm_glu_backward(a, b, gate, up)
    assert _rel(d_gate, ref_g) < TOL["bf16"] and _rel(d_up, ref_u) < TOL["bf16"]


def test_zero_k_gives_zero_gradients(torch):
    dy, w, gate, up = _case(torch, 64, 128, 0, "bf16")
    d_gate, d_up = (torch.full_like(gate, float("nan")) for _ in range(2))
    gemm_glu_backward(dy, w, gate, up, d_gate, d_up)
    assert not d_gate.any() and not d_up.any()
