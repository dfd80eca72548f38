"""Clusters in GPC order (``GemmConfig.cluster_order = "gpc"``) on the H100: the probe's order,
results against a float64 reference (outputs poisoned with NaN), and the slot claims under
repeated calls, streams, CUDA graphs and clusters that run one after another."""

import numpy as np
import pytest
from cuda.bindings import driver
from numba import cuda

from numba_hopper import GemmConfig, bmm, gemm
from numba_hopper.matmul.placement import TPCS, tpc_order
from numba_hopper.runtime.launch import device_limits, launch

pytestmark = pytest.mark.gpu

GPC_1X2 = GemmConfig(block_n=112, cluster_n=2, cluster_order="gpc", stages=6)
GPC_2X1 = GemmConfig(cluster_m=2, cluster_order="gpc")
GPC_2X1_ROWS = GemmConfig(cluster_m=2, cluster_order="gpc", group_n=8)  # the training tiles' walk


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _rand(torch, rows, cols, major, gen):
    if major == "R":
        return torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
    return torch.randn(cols, rows, generator=gen, device="cuda").to(torch.bfloat16).t()


def _operands(torch, M, N, K, layout="RC", seed=None):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(np.random.SeedSequence().entropy % 2**63 if seed is None else seed)
    return _rand(torch, M, K, layout[0], gen), _rand(torch, K, N, layout[1], gen)


def _rel_err(torch, out, a, b):
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all(), "unwritten (NaN) output elements"
    return ((out.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()


def test_the_probe_ranks_every_tpc_once():
    device = cuda.get_current_device().id
    address = tpc_order(device)
    assert tpc_order(device) == address  # probed once
    ranks = np.empty(TPCS, np.uint32)
    driver.cuMemcpyDtoH(ranks.ctypes.data, address, ranks.nbytes)
    assert sorted(ranks) == list(range(TPCS))
    # the GPU's TPCs come first: every one was seen by a probe cluster
    tpcs = device_limits(device).sm_count // 2
    assert sorted(ranks[:tpcs]) == list(range(tpcs))


@pytest.mark.parametrize("cfg", [GPC_1X2, GPC_2X1, GPC_2X1_ROWS], ids=["1x2", "2x1", "2x1-rows"])
@pytest.mark.parametrize("layout", ["RR", "RC", "CR", "CC"])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 129, 64), (129, 300, 77), (1000, 1000, 1000),
                                   (512, 3584, 2048), (4096 + 64, 4096 + 200, 13 * 64 - 5)])
def test_gpc_ordered_clusters_compute_every_tile(torch, cfg, layout, M, N, K):
    # from one tile (65 clusters without one) to several waves, with ragged edges and a
    # cluster CTA left without a tile of its own
    if cfg is GPC_1X2 and layout[1] == "R":  # (a row-major B's 64-wide boxes: 112 is for K-major B)
        cfg = GemmConfig(block_n=128, cluster_n=2, cluster_order="gpc", stages=6)
    a, b = _operands(torch, M, N, K, layout)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
    gemm(a, b, out=out, config=cfg)
    assert _rel_err(torch, out, a, b) < 1e-4


def test_the_default_runs_long_single_waves_in_gpc_order(torch):
    from numba_hopper.runtime.arrays import device_view
    from numba_hopper.matmul.heuristics import choose_config

    a, b = _operands(torch, 512, 3584, 8192)  # 128 x 112 tiles: 64 cluster tiles on 66 TPCs
    out = gemm(a, b)  # a user's call: fresh output
    cfg = choose_config(device_view(a), device_view(b), device_view(out), None, False)
    assert cfg.cluster_order == "gpc" and (cfg.cluster_m, cfg.cluster_n) == (1, 2)
    assert _rel_err(torch, out, a, b) < 1e-2


def test_results_repeat_across_calls_and_streams(torch):
    """Many calls of two plans on one stream, then on a second, each call's claims zeroed in its
    fresh scratch: bitwise-equal results each time (every tile written once, by the same kernel)."""
    a, b = _operands(torch, 512, 3584, 2048, seed=5)
    x, y = _operands(torch, 300, 1000, 776, "RR", seed=6)
    first = None
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    for stream in streams:
        with torch.cuda.stream(stream):
            for _ in range(10):
                out = gemm(a, b, config=GPC_1X2)
                small = bmm(torch.stack([x, x]), torch.stack([y, y]), config=GemmConfig(cluster_m=2, cluster_order="gpc"))
                first = out if first is None else first
                assert torch.equal(out, first)
        stream.synchronize()
    assert _rel_err(torch, first, a, b) < 1e-2
    assert _rel_err(torch, small[1].float(), x, y) < 1e-2


def test_gpc_order_in_a_cuda_graph(torch):
    a, b = _operands(torch, 512, 3584, 2048)
    out = torch.full((512, 3584), float("nan"), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gemm(a, b, out=out, config=GPC_1X2)  # the plan, outside the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        gemm(a, b, out=out, config=GPC_1X2)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(torch, out, a, b) < 1e-2


@cuda.jit
def hold_sm(ns):
    """Keep one SM (all its shared memory) busy for about ``ns`` nanoseconds."""
    for _ in range(ns // 1000):
        cuda.nanosleep(1000)


def test_clusters_that_run_one_after_another_claim_distinct_slots(torch):
    """Another stream's kernel holds all but a few SMs: the GEMM's clusters (a grid of every
    TPC) run a few at a time, several on one TPC one after another. Each still claims its
    own slot, so every tile is computed."""
    limits = device_limits(cuda.get_current_device().id)
    a, b = _operands(torch, 512, 3584, 1024)
    out = torch.full((512, 3584), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out, config=GPC_1X2)  # the plan and its probe
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    busy, mine = torch.cuda.Stream(), torch.cuda.Stream()
    launch(hold_sm, limits.sm_count - 8, 32, (50_000_000,), shared_mem=limits.max_shared_per_block_optin,
           stream=busy)
    with torch.cuda.stream(mine):
        gemm(a, b, out=out, config=GPC_1X2)
    torch.cuda.synchronize()
    assert _rel_err(torch, out, a, b) < 1e-2
