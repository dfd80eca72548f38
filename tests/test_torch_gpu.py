"""numba_hopper.torch on the H100: OpInfo samples, opcheck, autograd against float64,
training, torch.compile(fullgraph=True) with Inductor, and CUDA-graph capture and replay."""

import time

import pytest

torch = pytest.importorskip("torch")
nht = pytest.importorskip("numba_hopper.torch")

import _torch_cases as cases  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opinfo_samples(dtype, requires_grad):
    """Every OpInfo sample of mm, addmm, bmm, baddbmm and matmul through numba_hopper.torch,
    counted per op (printed with -s), none refused or wrong."""
    pytest.importorskip("expecttest")
    cases.check_all_samples("cuda", dtype, requires_grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_opinfo_samples_through_the_raw_api(dtype):
    """Every OpInfo sample of mm, addmm, bmm and baddbmm through numba_hopper.gemm / bmm
    (``_torch_cases.raw_call``), counted per op (printed with -s), none refused or wrong."""
    pytest.importorskip("expecttest")
    counts = cases.check_all_samples("cuda", dtype, False, raw=True)
    assert all(row["samples"] for row in counts.values()) and not any(row["refused"] for row in counts.values())


def test_opcheck():
    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)

    a, b, c, bias = randn(200, 64), randn(64, 136), randn(200, 136), randn(136)
    torch.library.opcheck(torch.ops.numba_hopper.gemm.default, (a, b), {})
    torch.library.opcheck(torch.ops.numba_hopper.gemm.default, (a, b),
                          {"c": c, "bias": bias, "alpha": 0.5, "beta": 2.0})
    torch.library.opcheck(torch.ops.numba_hopper.gemm_aux.default, (a, b), {"bias": bias, "activation": "gelu"})
    torch.library.opcheck(torch.ops.numba_hopper.bmm.default, (randn(3, 5, 10), randn(3, 10, 6)), {})


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid"])
@pytest.mark.parametrize("m", [1, 7, 1000])
def test_linear_gradients_match_float64(activation, m):
    torch.manual_seed(0)
    x = torch.randn(m, 384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(264, 384, device="cuda", dtype=torch.bfloat16) / 20).requires_grad_()
    b = torch.randn(264, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = nht.linear(x, w, b, activation=activation)
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    pre = torch.nn.functional.linear(*ref_leaves)
    ref = {None: pre, "relu": torch.relu(pre), "gelu": torch.nn.functional.gelu(pre),
           "gelu_tanh": torch.nn.functional.gelu(pre, approximate="tanh"),
           "silu": torch.nn.functional.silu(pre), "sigmoid": torch.sigmoid(pre)}[activation]
    grad_out = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), grad_out)
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out.double())
    assert cases.rel_error(y, ref) < 1e-2
    for g, r, t in zip(grads, ref_grads, (x, w, b)):
        assert g.shape == t.shape and g.is_contiguous() and torch.isfinite(g).all()
        assert cases.rel_error(g, r) < 2e-2


@pytest.mark.parametrize("layout,M,N,K", [("RC", 4000, 8456, 200), ("CR", 4000, 8456, 200),
                                          ("RC", 8000, 9728, 2560), ("CR", 14000, 4000, 1000),
                                          ("RC", 8000, 25400, 256), ("CR", 25400, 8000, 256),
                                          ("RR", 8000, 2000, 2000), ("CR", 5600, 2000, 1000)])
def test_sustained_config_matches_float64(layout, M, N, K):
    """``gemm(config="sustained")``'s tiles in the forward (RC), dX (RR) and dW (CR) layouts, ragged
    edges, into an output poisoned with NaN: 2x1 clusters in GPC order over the raster walked row
    by row in place of 128 x 192 tiles (the third and fourth) and of ping-pong tiles (the last two:
    3.9 and 2.7 waves), taken dynamically over 48 waves or more (the fifth and sixth)."""
    import numba_hopper

    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()  # x @ W.T
    if layout == "CR":  # dY.T @ X
        a, b = torch.randn(K, M, device="cuda", dtype=torch.bfloat16).t(), b.contiguous()
    if layout == "RR":  # dY @ W
        b = b.contiguous()
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    numba_hopper.gemm(a, b, out=out, config="sustained")
    assert cases.rel_error(out, a.double() @ b.double()) < 1e-2


def test_linear_gradients_in_the_training_tiles_match_float64():
    """A linear whose forward and dW products are large enough for the training tiles."""
    torch.manual_seed(0)
    x = torch.randn(4000, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(8456, 2048, device="cuda", dtype=torch.bfloat16) / 40).requires_grad_()
    y = nht.linear(x, w)
    leaves = [t.detach().double().requires_grad_() for t in (x, w)]
    ref = torch.nn.functional.linear(*leaves)
    grad_out = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w), grad_out)
    assert cases.rel_error(y, ref) < 1e-2
    for g, r in zip(grads, torch.autograd.grad(ref, leaves, grad_out.double())):
        assert cases.rel_error(g, r) < 2e-2


@pytest.mark.parametrize("shape", [(7, 384), (2, 33, 384), (1, 1, 5, 384)])
def test_linear_inference_eager_and_compiled(shape):
    """Under no_grad: eagerly one gemm on x's rows (no reshape), compiled the ``gemm_no_grad`` op."""
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(264, 384, device="cuda", dtype=torch.bfloat16) / 20
    b = torch.randn(264, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), w.double(), b.double()), approximate="tanh")
    compiled = torch.compile(nht.linear, fullgraph=True)
    with torch.no_grad():
        for y in (nht.linear(x, w, b, activation="gelu_tanh"), compiled(x, w, b, activation="gelu_tanh")):
            assert y.shape == (*shape[:-1], 264) and torch.isfinite(y).all()
            assert cases.rel_error(y, ref) < 1e-2


def test_compiled_no_grad_linear_calls_gemm_directly():
    """Inductor's wrapper calls ``numba_hopper.gemm(a, b, out=buf)`` for a linear without bias
    (``_lowering``); ragged M, then a dynamic M, each checked against float64."""
    from torch._inductor.utils import run_and_get_code

    w = torch.randn(264, 384, device="cuda", dtype=torch.bfloat16) / 20
    compiled = torch.compile(nht.linear, fullgraph=True)
    codes = []
    for m in (1, 7, 129, 1000):  # compiles for 1, then once for a dynamic M
        x = torch.randn(m, 384, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y, new_codes = run_and_get_code(compiled, x, w)
        codes += new_codes
        assert y.shape == (m, 264) and cases.rel_error(y, x.double() @ w.double().t()) < 1e-2
    assert codes and all("extern_kernels.numba_hopper_mm(" in c and "torch.ops.numba_hopper" not in c for c in codes)


def test_training_follows_nn_linear():
    stock, ours = cases.models("cuda", torch.bfloat16)
    ref = cases.training_losses(stock, "cuda", torch.bfloat16)
    got = cases.training_losses(ours, "cuda", torch.bfloat16)
    assert got[-1] < 0.5 * got[0]
    assert max(abs(g - r) / r for g, r in zip(got, ref)) < 0.05, (got, ref)


def test_compile_fullgraph_inductor():
    stock, ours = cases.models("cuda", torch.bfloat16)
    x = torch.randn(4, 33, 64, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(ours, fullgraph=True)
    got = compiled(x)
    assert cases.rel_error(got, ours(x)) < 1e-2 and cases.rel_error(got, stock(x)) < 2e-2
    got.float().square().sum().backward()
    compiled_grads = [p.grad.clone() for p in ours.parameters()]
    ours.zero_grad(set_to_none=True)
    ours(x).float().square().sum().backward()
    for g, ref in zip(compiled_grads, (p.grad for p in ours.parameters())):
        assert cases.rel_error(g, ref) < 2e-2
    x2 = torch.randn(2, 50, 64, device="cuda", dtype=torch.bfloat16)  # a new shape: recompiles
    assert cases.rel_error(compiled(x2), stock(x2)) < 2e-2


def test_cuda_graph_capture_and_replay_with_new_data():
    stock, ours = cases.models("cuda", torch.bfloat16)
    static_x = torch.randn(4, 33, 64, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        ours(static_x)  # warm up: compile, plans
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = ours(static_x)
    for _ in range(3):
        static_x.copy_(torch.randn_like(static_x))
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            ref = stock(static_x)
        assert torch.isfinite(static_y).all() and cases.rel_error(static_y, ref) < 2e-2


@pytest.mark.serial
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "forward+backward"])
def test_linear_call_never_waits_for_the_gpu(grad):
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

    def call(x):
        y = nht.linear(x.requires_grad_(grad), w, activation="silu")
        if grad:
            y.backward(torch.ones_like(y))
        return y

    call(x)  # warm: the plans exist
    fresh = torch.randn_like(x)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    gate = torch.cuda.Event()
    gate.record()
    start = time.perf_counter()
    y = call(fresh)
    host = time.perf_counter() - start
    assert not gate.query(), "linear returned only after the queued sleep had finished"
    assert host < 0.05, host
    ref = torch.nn.functional.silu(fresh.double() @ w.double().t())
    assert cases.rel_error(y, ref) < 1e-2
