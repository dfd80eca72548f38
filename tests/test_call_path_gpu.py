"""The call path as users take it: fresh operands, no ``out=``, new addresses every call (H100).

A plan is keyed on layouts, not addresses: these tests check that a reused plan computes
with each call's own operands, on each call's own stream, inside CUDA graphs too, and that
a call never waits for the GPU.
"""

import time

import numpy as np
import pytest

import numba_hopper
import numba_hopper.matmul.plan_cache as plan_cache
from numba_hopper.matmul import plan as _plan

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _err(torch, out, ref):
    assert torch.isfinite(out).all(), "unwritten (NaN) output elements"
    return ((out.double() - ref).norm() / ref.norm()).item()


def _count_encodes(monkeypatch):
    calls = []
    real = _plan.encode_template
    monkeypatch.setattr(_plan, "encode_template", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def test_top_level_call_on_fresh_operands_reuses_one_plan(torch, monkeypatch):
    encodes = _count_encodes(monkeypatch)
    shape = (300, 200, 264)
    x = torch.randn(shape[0], shape[1], device="cuda", dtype=torch.bfloat16)
    w = torch.randn(shape[1], shape[2], device="cuda", dtype=torch.bfloat16)
    numba_hopper.gemm(x, w)  # the layout's plan
    before, plans = len(encodes), len(plan_cache.plans)
    for _ in range(20):
        a = torch.randn(*shape[:2], device="cuda", dtype=torch.bfloat16)
        b = torch.randn(*shape[1:], device="cuda", dtype=torch.bfloat16)
        out = numba_hopper.gemm(a, b)
        assert _err(torch, out, a.double() @ b.double()) < 1e-2
    assert len(encodes) == before, "a new address encoded a descriptor"
    assert len(plan_cache.plans) == plans


def test_a_new_tensor_at_a_freed_address(torch):
    a = torch.randn(512, 384, device="cuda", dtype=torch.float16)
    b = torch.randn(384, 256, device="cuda", dtype=torch.float16)
    numba_hopper.gemm(a, b)
    address = a.data_ptr()
    del a
    a = torch.randn(512, 384, device="cuda", dtype=torch.float16)  # the caching allocator hands the block back
    assert a.data_ptr() == address
    out = numba_hopper.gemm(a, b, out_dtype="f32")
    assert _err(torch, out, a.double() @ b.double()) < 1e-4


@pytest.mark.serial
def test_calls_interleaved_on_two_streams(torch):
    """Same layout (one plan), distinct operands, two streams whose work overlaps in time."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    M, N, K = 2048, 1536, 1024
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)  # a backlog on both, so their GEMMs run side by side
    jobs = []
    for i in range(8):
        s = streams[i % 2]
        with torch.cuda.stream(s):
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
            jobs.append((a, b, numba_hopper.gemm(a, b), s))
    torch.cuda.synchronize()
    for a, b, out, _ in jobs:
        assert _err(torch, out, a.double() @ b.double()) < 1e-2


@pytest.mark.parametrize("layout", ["RR", "CC"])
def test_fused_epilogue_on_fresh_operands(torch, layout):
    M, N, K = 700, 384, 320
    for _ in range(3):  # the first call builds the plan, the others reuse it with new arrays
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        if layout == "CC":
            a, b = a.t().contiguous().t(), b.t().contiguous().t()
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        c = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        scale = torch.rand(M, device="cuda") + 0.5
        alpha = float(np.random.uniform(0.5, 2))
        out = numba_hopper.gemm(a, b, c=c, beta=0.5, alpha=alpha, bias=bias, bias_dim=1, row_scale=scale,
                                activation="gelu_tanh")
        pre = alpha * scale.double()[:, None] * (a.double() @ b.double()) + 0.5 * c.double() + bias.double()
        ref = torch.nn.functional.gelu(pre, approximate="tanh")
        assert _err(torch, out, ref) < 1e-2


@pytest.mark.parametrize("rows", [(1, 7), (4, 129), (2, 3, 64)])
def test_activations_of_more_dimensions(torch, rows):
    """``gemm(x, w.t())`` on (..., K) activations, as ``F.linear``: the leading dimensions are
    rows, the output is (..., N); with out=, c and aux_out of that shape too."""
    K, N = 192, 136
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # the second call reuses the plan with new arrays
        x = torch.randn(*rows, K, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w.double().t()
        out = numba_hopper.gemm(x, w.t())
        assert out.shape == (*rows, N) and _err(torch, out, ref) < 1e-2
        c = torch.randn(*rows, N, device="cuda", dtype=torch.bfloat16)
        out = torch.full((*rows, N), float("nan"), device="cuda", dtype=torch.float32)
        aux = torch.full((*rows, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        numba_hopper.gemm(x, w.t(), out=out, c=c, beta=1.0, activation="relu", aux_out=aux)
        assert _err(torch, aux, ref + c.double()) < 1e-2
        assert _err(torch, out, torch.relu(ref + c.double())) < 1e-2


def test_split_k_and_unaligned_operands_on_fresh_operands(torch):
    for _ in range(2):
        a = torch.randn(64, 8192 + 3, device="cuda", dtype=torch.bfloat16)[:, 3:]  # unaligned: copied
        b = torch.randn(8192, 1001, device="cuda", dtype=torch.bfloat16)  # odd N: copied, and split-K
        out = numba_hopper.gemm(a, b, out_dtype="f32")
        assert _err(torch, out, a.double() @ b.double()) < 1e-4


@pytest.mark.serial
@pytest.mark.parametrize("M,N,K,w_t", [(1024, 1024, 1024, False), (8, 2048, 2048, False),  # (swapped)
                                       (512, 3584, 8192, True)])  # (x @ W.T: GPC-ordered clusters, slot claims)
def test_a_call_never_waits_for_the_gpu(torch, M, N, K, w_t):
    def operands():
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t() if w_t else torch.randn(
            K, N, device="cuda", dtype=torch.bfloat16)
        return torch.randn(M, K, device="cuda", dtype=torch.bfloat16), b

    numba_hopper.gemm(*operands())  # the plan exists; the operands below are new to it
    fresh = operands()
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning on the current stream
    gate = torch.cuda.Event()
    gate.record()
    start = time.perf_counter()
    out = numba_hopper.gemm(*fresh)
    host = time.perf_counter() - start
    assert not gate.query(), "gemm returned only after the queued sleep had finished"
    assert host < 0.05, host
    torch.cuda.synchronize()
    assert _err(torch, out, fresh[0].double() @ fresh[1].double()) < 1e-2


def test_cuda_graph_replay_with_new_data(torch):
    M, N, K = 1000, 768, 512
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, plans) before capturing
        numba_hopper.gemm(a, b, bias=bias, bias_dim=1, activation="relu")
        numba_hopper.gemm(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused = numba_hopper.gemm(a, b, bias=bias, bias_dim=1, activation="relu")
        plain = numba_hopper.gemm(a, b)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        fused.fill_(float("nan"))
        plain.fill_(float("nan"))
        numba_hopper.gemm(a.clone(), b.clone())  # eager work with the captured plan between replays
        graph.replay()
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        assert _err(torch, plain, ref) < 1e-2
        assert _err(torch, fused, torch.relu(ref + bias.double())) < 1e-2
