"""GEMMs launched as programmatic dependents (H100): each may start while the previous GEMM of
the stream still runs, so these chains check that it reads only what that GEMM finished
writing, and overwrites nothing that GEMM still reads, eagerly and in a CUDA graph.

The first GEMM of each chain is long and narrow (4 tiles of 128 x 128, 256 k-blocks, an
explicit config so it does not split K): it releases its dependents once its loads are
issued, whose CTAs then start on the 128 idle SMs and would race it without
``griddepcontrol.wait``.
"""

import pytest

import numba_hopper
from numba_hopper import GemmConfig
from numba_hopper.matmul import plan

pytestmark = pytest.mark.gpu

LONG = GemmConfig(block_m=128, block_n=128)
M, K, N = 256, 16384, 256


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _rel_err(out, ref):
    assert out.isfinite().all(), "unwritten (NaN) or raced output elements"
    return ((out.double() - ref).norm() / ref.norm()).item()


def _operands(torch):
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    return randn(M, K), randn(K, N), randn(N, N), randn(M, 64), randn(64, K)


def _chain(x, w1, w2, p, q, y, z):
    """y = x @ w1 (long), z = y @ w2 (reads y), then x = p @ q (overwrites what the first read)."""
    numba_hopper.gemm(x, w1, out=y, config=LONG)
    numba_hopper.gemm(y, w2, out=z)
    numba_hopper.gemm(p, q, out=x)


def _check(x0, w1, w2, p, q, x, y, z):
    y_ref = x0.double() @ w1.double()
    assert _rel_err(y, y_ref) < 1e-2  # the first GEMM read x before the third overwrote it
    assert _rel_err(z, y.double() @ w2.double()) < 1e-2  # the second read the first's whole output
    assert _rel_err(x, p.double() @ q.double()) < 1e-2


def _launched_as_dependents(monkeypatch, mode, *operands):
    asked = []
    real = plan.prepare_launch
    monkeypatch.setattr(plan, "prepare_launch", lambda *a, **kw: asked.append(kw["dependent"]) or real(*a, **kw))
    monkeypatch.setattr(plan, "DEPENDENT_LAUNCH", mode)
    numba_hopper.matmul.clear_plans()
    numba_hopper.gemm(*operands)
    return asked


@pytest.mark.parametrize("mode,dependent", [("all", True), ("none", False)])
def test_which_plans_launch_as_programmatic_dependents(torch, monkeypatch, mode, dependent):
    x, w1, *_ = _operands(torch)
    tokens, weight = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for shape in ((8, 2048), (2048, 2048)))
    assert _launched_as_dependents(monkeypatch, mode, tokens, weight.t()) == [dependent]  # runs swapped
    assert _launched_as_dependents(monkeypatch, mode, x, w1) == [dependent]


@pytest.fixture(autouse=True)
def every_gemm_dependent(monkeypatch):
    """The chains below need every GEMM launched as a dependent, whatever NUMBA_HOPPER_PDL says."""
    monkeypatch.setattr(plan, "DEPENDENT_LAUNCH", "all")
    numba_hopper.matmul.clear_plans()
    yield
    numba_hopper.matmul.clear_plans()


def test_a_chain_reads_and_overwrites_in_stream_order(torch):
    x, w1, w2, p, q = _operands(torch)
    y, z = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    _chain(x.clone(), w1, w2, p, q, y, z)  # plans and kernels first: loading one would serialize the chain
    x0 = x.clone()
    y.fill_(float("nan"))
    z.fill_(float("nan"))
    _chain(x, w1, w2, p, q, y, z)
    torch.cuda.synchronize()
    _check(x0, w1, w2, p, q, x, y, z)


def test_a_captured_chain_replays_with_new_data(torch):
    x, w1, w2, p, q = _operands(torch)
    y, z = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    _chain(x.clone(), w1, w2, p, q, y, z)  # plans and kernels before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _chain(x, w1, w2, p, q, y, z)
    for _ in range(3):
        fresh = _operands(torch)
        for static, new in zip((x, w1, w2, p, q), fresh):
            static.copy_(new)
        y.fill_(float("nan"))
        z.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(fresh[0], w1, w2, p, q, x, y, z)
