"""Sums of products (``gemm_sum``) on the H200 against float64, outputs poisoned with NaN: ragged
sizes, every operand layout, both dtypes; and a compiled transformers model whose input gradients
the post-grad pass sums in one GEMM each."""

import copy

import pytest

from numba_hopper import gemm_sum

pytestmark = pytest.mark.gpu

TOL = {"bf16": 1e-2, "f16": 3e-3}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def _pairs(torch, M, N, Ks, dtype, seed=0, a_major="K", b_major="N"):
    """``(a_i, b_i)`` of (M, K_i) and (K_i, N): row-major, or column-major where a major says so."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    pairs = []
    for k in Ks:
        a = torch.randn(M, k, generator=gen, device="cuda").to(tdt)
        b = torch.randn(k, N, generator=gen, device="cuda").div(sum(Ks) ** 0.5).to(tdt)
        pairs.append((a if a_major == "K" else a.t().contiguous().t(), b if b_major == "N" else b.t().contiguous().t()))
    return pairs


def _reference(pairs):
    return sum(a.double() @ b.double() for a, b in pairs)


# Rows 1-1000 and a full-size one; K per pair ragged (a partial k-block in the middle of the sum)
@pytest.mark.parametrize("M,N,Ks", [(1, 64, (64, 64)), (7, 200, (136, 8, 72)), (127, 384, (1000, 24)),
                                    (129, 1000, (520, 64, 520)), (1000, 256, (7, 129, 1000)),
                                    (4096, 2048, (2048, 512, 512))])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_sum_of_products(torch, M, N, Ks, dtype):
    pairs = _pairs(torch, M, N, Ks, dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=pairs[0][0].dtype)
    gemm_sum(pairs, out)
    fresh = gemm_sum(pairs, config="sustained")
    ref = _reference(pairs)
    assert _rel(out, ref) < TOL[dtype] and _rel(fresh, ref) < TOL[dtype]


@pytest.mark.parametrize("a_major,b_major,out_major", [("M", "N", "N"), ("K", "K", "N"), ("M", "K", "M"),
                                                      ("K", "N", "M")])
def test_every_layout(torch, a_major, b_major, out_major):
    pairs = _pairs(torch, 300, 264, (128, 200, 64), "bf16", seed=1, a_major=a_major, b_major=b_major)
    out = torch.full((300, 264) if out_major == "N" else (264, 300), float("nan"), device="cuda",
                     dtype=torch.bfloat16)
    out = out if out_major == "N" else out.t()
    gemm_sum(pairs, out)
    assert _rel(out, _reference(pairs)) < TOL["bf16"]


def test_mixed_majors_and_unaligned_operands(torch):
    """Pairs in different majors, and an operand TMA cannot address (odd K), are read through copies."""
    row, col = _pairs(torch, 130, 72, (96,), "bf16", seed=2), _pairs(torch, 130, 72, (40,), "bf16", seed=3,
                                                                      a_major="M", b_major="K")
    odd = _pairs(torch, 130, 72, (33,), "bf16", seed=4)
    pairs = row + col + odd
    out = torch.full((130, 72), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_sum(pairs, out)
    assert _rel(out, _reference(pairs)) < TOL["bf16"]


def test_zero_k_pairs_add_nothing(torch):
    pairs = _pairs(torch, 65, 128, (0, 96, 0), "bf16", seed=5)
    assert _rel(gemm_sum(pairs), _reference(pairs)) < TOL["bf16"]
    empty = _pairs(torch, 65, 128, (0,), "bf16")
    assert torch.equal(gemm_sum(empty), torch.zeros(65, 128, device="cuda", dtype=torch.bfloat16))


def _qwen3():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096,
                                      use_cache=False, attn_implementation="sdpa")
    torch_ = pytest.importorskip("torch")
    torch_.manual_seed(0)
    with torch_.device("cuda"):
        return transformers.Qwen3ForCausalLM(config).to(torch_.bfloat16).train()


def test_compiled_training_sums_each_input_gradient_in_one_gemm(torch):
    """A compiled Qwen3 training step: each layer's q, k, v input gradient and its gate, up input
    gradient is one ``gemm_sum``, and its MLP's SiLU-and-multiply derivative is in the epilogue of
    ``dy @ W_down`` (``gemm_glu_backward``); every gradient as close to float64 as the stock model's."""
    import numba_hopper.torch as nht
    from torch._inductor.utils import run_and_get_code

    stock = _qwen3()
    ours, exact = copy.deepcopy(stock), copy.deepcopy(stock).double()
    nht.replace_linear(ours)
    ids = torch.randint(0, 4096, (2, 129), device="cuda")
    exact(input_ids=ids, labels=ids).loss.backward()
    torch.compile(stock)(input_ids=ids, labels=ids).loss.backward()

    def step():
        torch.compile(ours)(input_ids=ids, labels=ids).loss.backward()

    with torch._inductor.config.patch(force_disable_caches=True):  # (a cached graph runs no pass)
        _, codes = run_and_get_code(step)
    assert sum(code.count("extern_kernels.numba_hopper_mm_sum(") for code in codes) == 4, codes
    assert sum(code.count("torch.ops.numba_hopper.mm_glu_backward.default(") for code in codes) == 2, codes
    for (name, p), q, r in zip(ours.named_parameters(), stock.parameters(), exact.parameters()):
        assert _rel(p.grad, r.grad) < max(1.5 * _rel(q.grad, r.grad), 1e-2), name
