"""Gated products (``gemm(a, b, up=, activation=)``) on the H100 against float64 references, outputs
poisoned with NaN; and the compiled SwiGLU MLP that uses them."""

import pytest

from numba_hopper import gemm
from numba_hopper.kernels.gemm_config import GemmConfig

pytestmark = pytest.mark.gpu

TOL = {"bf16": 1e-2, "f16": 3e-3, "f32": 2e-3}  # output rounding; f32: the hardware tanh (2^-11)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _case(torch, M, N, K, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x = torch.randn(M, K, generator=gen, device="cuda").to(tdt)
    wg, wu = (torch.randn(N, K, generator=gen, device="cuda").div(K ** 0.5).to(tdt) for _ in range(2))
    return x, wg, wu


def _reference(torch, x, wg, wu, activation):
    F = torch.nn.functional
    act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "relu": F.relu,
           "sigmoid": torch.sigmoid, None: lambda v: v}[activation]
    x, wg, wu = x.double(), wg.double(), wu.double()
    return act(x @ wg.t()) * (x @ wu.t())


def _rel(torch, got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


# Rows 1-1000 (64- and 128-row tiles, partial tiles), ragged N (a partial half tile), K ragged and
# long; 4096 x 5632 leaves a partial last wave (1408 tiles of 128 x 256 on 132 SMs).
@pytest.mark.parametrize("M,N,K", [(1, 64, 64), (7, 200, 136), (64, 128, 64), (129, 1000, 520), (1000, 384, 1000),
                                   (4096, 5632, 2048)])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gated_product(torch, M, N, K, dtype):
    x, wg, wu = _case(torch, M, N, K, dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=x.dtype)
    gemm(x, wg.t(), out=out, up=wu.t(), activation="silu")
    fresh = gemm(x, wg.t(), up=wu.t(), activation="silu")
    ref = _reference(torch, x, wg, wu, "silu")
    assert _rel(torch, out, ref) < TOL[dtype] and _rel(torch, fresh, ref) < TOL[dtype]


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "sigmoid", None])
def test_gated_activations_and_f32_output(torch, activation):
    x, wg, wu = _case(torch, 300, 320, 256, "bf16", seed=1)
    out = torch.full((300, 320), float("nan"), device="cuda")
    gemm(x, wg.t(), out=out, up=wu.t(), activation=activation)
    assert _rel(torch, out, _reference(torch, x, wg, wu, activation)) < TOL["f32"]


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (64, 256), (128, 256)])
def test_gated_tiles(torch, block_m, block_n):
    """Every gated tile, forced, over a batch of activations (M from (2, 333, K))."""
    x, wg, wu = _case(torch, 666, 456, 320, "bf16", seed=2)
    cfg = GemmConfig(block_m=block_m, block_n=block_n, stages=3)
    got = gemm(x.view(2, 333, 320), wg.t(), up=wu.t(), activation="silu", config=cfg)
    assert got.shape == (2, 333, 456)
    assert _rel(torch, got.view(666, 456), _reference(torch, x, wg, wu, "silu")) < TOL["bf16"]


def test_gated_call_never_waits_for_the_gpu(torch):
    """A gated call on a GPU kept busy returns at once (no synchronization on the call path)."""
    import time

    x, wg, wu = _case(torch, 512, 1024, 512, "bf16")
    gemm(x, wg.t(), up=wu.t(), activation="silu")  # plan and kernel
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~100 ms of GPU time queued ahead
    t = time.perf_counter()
    for _ in range(10):
        gemm(x, wg.t(), up=wu.t(), activation="silu")
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    assert host < 0.05, host


def _mlp_class(torch):
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = (torch.nn.Linear(512, 1408, bias=False) for _ in range(2))
            self.down_proj = torch.nn.Linear(1408, 512, bias=False)
            self.act_fn = torch.nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    return MLP


def test_fused_mlp_in_a_cuda_graph(torch):
    """``fuse_gated_mlps``: eager inference and a captured CUDA graph replayed on new data match the
    float64 MLP."""
    import numba_hopper.torch as nht

    MLP = _mlp_class(torch)
    mlp = torch.nn.Sequential(MLP()).cuda().to(torch.bfloat16)  # (MLPs inside the model are replaced)
    ref = torch.nn.Sequential(MLP()).cuda().double()
    ref.load_state_dict(mlp.state_dict())
    assert nht.fuse_gated_mlps(mlp) == 1
    x = torch.randn(4, 300, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert _rel(torch, mlp(x), ref(x.double())) < 2e-2  # (also the warm-up the capture needs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = mlp(x)
        for _ in range(2):
            x.copy_(torch.randn_like(x))
            y.fill_(float("nan"))
            graph.replay()
            assert _rel(torch, y, ref(x.double())) < 2e-2


def test_compiled_swiglu_mlp_runs_one_gated_gemm(torch):
    """torch.compile of a Llama MLP on numba_hopper linears, under no_grad: one gated GEMM for gate
    and up, matching the stock MLP."""
    import numba_hopper.torch as nht
    from torch._inductor.utils import run_and_get_code

    MLP = _mlp_class(torch)
    stock = MLP().cuda().to(torch.bfloat16)
    x = torch.randn(4, 300, 512, device="cuda", dtype=torch.bfloat16)
    ref = MLP().cuda().double()
    ref.load_state_dict(stock.state_dict())
    expected = ref(x.double())
    nht.replace_linear(stock)
    with torch.no_grad():
        got, (code, *_) = run_and_get_code(torch.compile(stock, fullgraph=True), x)
    assert code.count("extern_kernels.numba_hopper_gated_mm(") == 1, code
    assert _rel(torch, got, expected) < 2e-2



# N = 100: up's half starts 200 bytes in, which TMA cannot address (written through a copy).
@pytest.mark.parametrize("M,N,K", [(1, 64, 64), (7, 200, 136), (127, 100, 64), (129, 1000, 520), (1000, 384, 1000),
                                   (4096, 5632, 2048)])
@pytest.mark.parametrize("dtype,aux_dtype", [("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32")])
def test_gated_product_keeps_both_products(torch, M, N, K, dtype, aux_dtype):
    """``aux_out`` (M, 2N): the gate's product, then up's, beside the gated output."""
    x, wg, wu = _case(torch, M, N, K, dtype, seed=3)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=x.dtype)
    aux_t = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[aux_dtype]
    pre = torch.full((M, 2 * N), float("nan"), device="cuda", dtype=aux_t)
    gemm(x, wg.t(), out=out, up=wu.t(), activation="silu", aux_out=pre)
    xd = x.double()
    assert _rel(torch, out, _reference(torch, x, wg, wu, "silu")) < TOL[dtype]
    assert _rel(torch, pre[:, :N], xd @ wg.double().t()) < TOL[aux_dtype]
    assert _rel(torch, pre[:, N:], xd @ wu.double().t()) < TOL[aux_dtype]


@pytest.mark.parametrize("tokens", [1, 7, 127, 129, 1000])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gated_mlp_training_matches_float64(torch, tokens, dtype):
    """The fused MLP's forward and every gradient (x, the three weights, down's bias) against the
    float64 MLP, at ragged token counts and widths."""
    import _torch_cases as cases

    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    errors = cases.gated_mlp_errors("cuda", tdt, (tokens, 264), hidden=264, inner=1000, bias=tokens % 2 == 1)
    assert max(errors.values()) < 2 * TOL[dtype], errors


def test_compiled_gated_mlp_training_matches_float64(torch):
    import _torch_cases as cases

    errors = cases.gated_mlp_errors("cuda", torch.bfloat16, (4, 300, 512), hidden=512, inner=1408, compiled=True)
    assert max(errors.values()) < 2 * TOL["bf16"], errors
