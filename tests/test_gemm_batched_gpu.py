"""Split-K, 128-wide tiles for narrow N and batched GEMM (bmm) on a Hopper GPU."""

import pytest

from numba_hopper import GemmConfig, bmm, gemm

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _rand(torch, *shape, dtype="bfloat16"):
    return torch.randn(*shape, device="cuda").to(getattr(torch, dtype))


def _err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("M,N,K,splits", [(128, 1024, 8192, None), (64, 512, 4096, None),
                                          (100, 300, 4007, 3), (1, 7, 1000, 5), (129, 257, 700, 16)])
@pytest.mark.parametrize("out_dtype,tol", [("float32", 1e-4), ("bfloat16", 1e-2), ("float16", 2e-3)])
def test_split_k(torch, M, N, K, splits, out_dtype, tol):
    # K not a multiple of the slice (4007 = 63 k-blocks over 3 slices; 16 slices of 700)
    a, b = _rand(torch, M, K), _rand(torch, K, N)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out_dtype))
    if splits:  # the default tile, in the given K slices
        gemm(a, b, out=out, config=GemmConfig(), split_k=splits)
    else:
        gemm(a, b, out=out)
    assert torch.isfinite(out).all()
    assert _err(out, a.double() @ b.double()) < tol


def test_split_k_is_deterministic_and_column_major_out(torch):
    a, b = _rand(torch, 96, 2048).t().contiguous().t(), _rand(torch, 2048, 200)
    outs = []
    for _ in range(2):
        out = torch.full((200, 96), float("nan"), device="cuda").t()  # column-major (96, 200)
        gemm(a, b, out=out, config=GemmConfig(), split_k=4)
        outs.append(out.clone())
    assert torch.equal(outs[0], outs[1])
    assert _err(outs[0], a.double() @ b.double()) < 1e-4


@pytest.mark.parametrize("N", [1, 100, 128])
def test_narrow_n_uses_128_wide_tiles(torch, N):
    a, b = _rand(torch, 1000, 512), _rand(torch, 512, N)
    out = torch.full((1000, N), float("nan"), device="cuda")
    gemm(a, b, out=out)
    assert _err(out, a.double() @ b.double()) < 1e-4


@pytest.mark.parametrize("batch", [1, 3, 17])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (129, 200, 80), (256, 512, 304), (64, 8, 24)])
@pytest.mark.parametrize("layout", ["RR", "CC"])
def test_bmm(torch, batch, M, N, K, layout):
    a = _rand(torch, batch, M, K) if layout[0] == "R" else _rand(torch, batch, K, M).transpose(1, 2)
    b = _rand(torch, batch, K, N) if layout[1] == "R" else _rand(torch, batch, N, K).transpose(1, 2)
    # (leading dimensions and batch strides that are not multiples of 16 bytes are copied)
    out = torch.full((batch, M, N), float("nan"), device="cuda")
    bmm(a, b, out=out)
    assert torch.isfinite(out).all()
    assert _err(out, a.double() @ b.double()) < 1e-4


def test_bmm_broadcast_operands(torch):
    a2 = _rand(torch, 200, 64)                      # one A for every batch item (2-D)
    b = _rand(torch, 5, 64, 96)
    out = bmm(a2, b, out_dtype="f32")
    assert out.shape == (5, 200, 96)
    assert _err(out, a2.double() @ b.double()) < 1e-4
    a = _rand(torch, 5, 200, 64)
    b1 = _rand(torch, 1, 64, 96).expand(5, 64, 96)  # batch stride 0
    out = torch.full((5, 200, 96), float("nan"), device="cuda", dtype=torch.bfloat16)
    bmm(a, b1, out=out)
    assert _err(out, a.double() @ b1.double()) < 1e-2


def test_bmm_refuses_batches_that_do_not_broadcast(torch):
    with pytest.raises(ValueError, match="batch sizes"):
        bmm(_rand(torch, 3, 8, 8), _rand(torch, 4, 8, 8))


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_bmm_stream_k(torch, batch):
    """Stream-K runs across batch items too (a CTA's run may end in one and start in the next)."""
    a = _rand(torch, batch, 200, 1000)
    b = _rand(torch, 1, 1000, 136).expand(batch, 1000, 136)
    out = torch.full((batch, 200, 136), float("nan"), device="cuda")
    bmm(a, b, out=out, config=GemmConfig(block_n=64, stages=4, stream_k=True))
    assert torch.isfinite(out).all()
    assert _err(out, a.double() @ b.double()) < 1e-4
