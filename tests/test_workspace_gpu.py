"""Scratch in stream order on the H100/H200 (runtime/workspace.py): a reused stream handle,
streams made and destroyed by the hundred, running out of memory, CUDA graphs.

The calls that take scratch here: an operand TMA cannot address (a bf16 row of an odd length),
copied into aligned scratch, and split-K's partial sums.
"""

import queue
import threading

import numpy as np
import pytest
from cuda.bindings import driver

from numba_hopper import GemmConfig, gemm
from numba_hopper.errors import DeviceOutOfMemoryError
from numba_hopper.matmul import plan as _plan
from numba_hopper.runtime.workspace import CLAIMS_BYTES, bind_primary_context, scratch_pool_bytes

pytestmark = pytest.mark.gpu

OK = driver.CUresult.CUDA_SUCCESS
SPLIT_K = dict(config=GemmConfig(block_m=64, block_n=128), split_k=3)  # gemm's keywords


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _rel(torch, got, ref):
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


def _bf16(torch, *shape, gen=None):
    return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)


def _new_stream():
    """A new CUstream handle (``cuStreamCreate``), as a server that makes a stream per request has."""
    err, stream = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
    assert err == OK, err
    return int(stream)


def _destroy(stream):
    (err,) = driver.cuStreamDestroy(stream)
    assert err == OK, err


def _stream_with_handle(handle):
    """A new stream with ``handle`` (the driver reuses a destroyed stream's), or skip."""
    tried = []
    try:
        for _ in range(16):
            stream = _new_stream()
            if stream == handle:
                return stream
            tried.append(stream)
    finally:
        for stream in tried:
            _destroy(stream)
    pytest.skip("the driver gave no new stream the destroyed stream's handle")


def _recording_scratch(monkeypatch):
    """``[(stream, first byte, end)]`` of each call's scratch from here on, claims included."""
    taken, real = [], _plan.alloc_scratch

    def alloc_scratch(device, stream, nbytes, zero_claims):
        scratch = real(device, stream, nbytes, zero_claims)
        taken.append((stream, scratch - CLAIMS_BYTES, scratch + nbytes))
        return scratch

    monkeypatch.setattr(_plan, "alloc_scratch", alloc_scratch)
    return taken


@pytest.mark.serial  # it orders two streams' kernels in time
def test_a_reused_stream_handle_never_shares_scratch_with_queued_work(torch, monkeypatch):
    """Stream A queues a long product whose kernel reads its scratch (an aligned copy of ``a``)
    for milliseconds; A is destroyed with it queued, and a new stream B with A's handle runs a
    product of the same plan on other data while A's kernel still reads. B's scratch is other
    memory, and both results are right (scratch kept per stream handle would have handed B
    A's buffer, and B's copy would have overwritten A's operand under its kernel)."""
    M, N, K = 128, 512, 2**19 - 1  # 4 tiles of 128 x 128 (4 SMs busy, the rest free for B), ~3 ms
    cfg = GemmConfig(block_m=128, block_n=128)
    gen = torch.Generator(device="cuda").manual_seed(1)
    a1, a2, b = _bf16(torch, M, K, gen=gen), _bf16(torch, M, K, gen=gen), _bf16(torch, K, N, gen=gen)
    o1, o2 = (torch.full((M, N), float("nan"), device="cuda") for _ in range(2))
    gemm(a1, b, out=o1, config=cfg, split_k=1)  # compile and plan first
    o1.fill_(float("nan"))
    torch.cuda.synchronize()
    taken = _recording_scratch(monkeypatch)
    start_a, end_a, start_b = (torch.cuda.Event(enable_timing=True) for _ in range(3))

    a_handle = _new_stream()
    stream_a = torch.cuda.ExternalStream(a_handle)
    start_a.record(stream_a)
    gemm(a1, b, out=o1, config=cfg, split_k=1, stream=a_handle)
    end_a.record(stream_a)
    _destroy(a_handle)  # with the product queued or running
    b_handle = _stream_with_handle(a_handle)
    stream_b = torch.cuda.ExternalStream(b_handle)
    with torch.cuda.stream(stream_b):
        torch.cuda._sleep(2_000_000)  # ~1 ms: A's kernel is well into its K loop
    start_b.record(stream_b)
    gemm(a2, b, out=o2, config=cfg, split_k=1, stream=b_handle)
    torch.cuda.synchronize()
    _destroy(b_handle)

    (stream_1, lo_1, hi_1), (stream_2, lo_2, hi_2) = taken
    assert stream_1 == stream_2 == a_handle
    for out, a in ((o1, a1), (o2, a2)):
        assert _rel(torch, out, a.float() @ b.float()) < 1e-2
    if start_b.elapsed_time(end_a) <= 0:  # then A's scratch may serve B: an overlap says nothing
        pytest.skip("this driver ran the new stream's work after the destroyed stream's (seen with the "
                    "H200's 580 driver): B's call could not run while A's kernel did")
    assert hi_2 <= lo_1 or hi_1 <= lo_2, f"B's scratch [{lo_2:#x}, {hi_2:#x}) overlaps A's [{lo_1:#x}, {hi_1:#x})"


@pytest.mark.serial  # it orders calls against queued GPU work
def test_calls_that_take_scratch_never_wait_for_the_gpu(torch):
    """With ~0.5 s of work queued on the stream, calls that take scratch (each a stream-ordered
    allocation and free, and the copy or split-K launches between) return before it is done."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    a, b = _bf16(torch, 300, 1001, gen=gen), _bf16(torch, 1001, 256, gen=gen)
    x, y = _bf16(torch, 64, 4096, gen=gen), _bf16(torch, 4096, 1024, gen=gen)
    outs = [torch.full((300, 256), float("nan"), device="cuda"), torch.full((64, 1024), float("nan"), device="cuda")]
    gemm(a, b, out=outs[0])  # compile and plan first
    gemm(x, y, out=outs[1], **SPLIT_K)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    gate = torch.cuda.Event()
    gate.record()
    for _ in range(20):
        gemm(a, b, out=outs[0])
        gemm(x, y, out=outs[1], **SPLIT_K)
    assert not gate.query(), "a call waited for the GPU"
    torch.cuda.synchronize()
    for got, ref in zip(outs, (a.double() @ b.double(), x.double() @ y.double())):
        assert _rel(torch, got, ref) < 1e-3


# (layout: a, b) -> the operands' shapes
_THREAD_CASES = {"scratch": ((300, 1001), (1001, 256)), "new": ((328, 512), (512, 256)),
                 "planned": ((320, 512), (512, 256))}


@pytest.mark.parametrize("layout", list(_THREAD_CASES))
def test_a_thread_with_no_current_context_runs_a_gemm(torch, layout):
    """PyTorch runs backward in threads of its own, where the driver has no current context: a
    call there binds the device's primary one, whether it takes scratch (an odd-length row,
    copied), encodes a new layout's tensor maps, or only launches a planned layout."""
    (m, k), (_, n) = _THREAD_CASES[layout]
    a, b = _bf16(torch, m, k), _bf16(torch, k, n)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    if layout == "planned":
        gemm(a, b, out=torch.empty_like(out))
    torch.cuda.synchronize()
    seen = []

    def call():
        try:
            seen.append(int(driver.cuCtxGetCurrent()[1]))  # 0: none, as in an autograd thread
            gemm(a, b, out=out)
            seen.append(None)
        except Exception as exc:  # reported by the main thread
            seen.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert seen == [0, None], seen
    torch.cuda.synchronize()
    assert _rel(torch, out, a.double() @ b.double()) < 1e-2


def test_out_of_memory_for_scratch_raises_and_the_next_call_works(torch, monkeypatch):
    """Scratch of more bytes than the device has (asked for through a wrapped allocator) raises
    DeviceOutOfMemoryError, a MemoryError naming the bytes, with nothing launched; the same
    call then runs and is right."""
    M, N, K = 300, 256, 1001  # a's rows are 2002 bytes: copied into aligned scratch
    a, b = _bf16(torch, M, K), _bf16(torch, K, N)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    device_bytes = torch.cuda.mem_get_info()[1]
    real = _plan.alloc_scratch
    with monkeypatch.context() as mp:
        mp.setattr(_plan, "alloc_scratch", lambda device, stream, nbytes, zero_claims:
                   real(device, stream, device_bytes + nbytes, zero_claims))
        with pytest.raises(DeviceOutOfMemoryError, match=r"scratch needs \d+ bytes") as info:
            gemm(a, b, out=out)
    assert isinstance(info.value, MemoryError) and info.value.nbytes > device_bytes
    assert f"{info.value.nbytes} bytes" in str(info.value)
    torch.cuda.synchronize()  # no error left behind in the context
    assert torch.isnan(out).all(), "nothing was to be launched"
    assert gemm(a, b, out=out) is out
    assert _rel(torch, out, a.double() @ b.double()) < 1e-2


def test_captured_scratch_is_the_graphs_own(torch):
    """Calls that take scratch, captured in a CUDA graph (allocation and free nodes), replayed
    between eager calls of the same plans on another stream: every result right."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    a, b = _bf16(torch, 300, 1001, gen=gen), _bf16(torch, 1001, 256, gen=gen)
    x, y = _bf16(torch, 64, 4096, gen=gen), _bf16(torch, 4096, 1024, gen=gen)

    def calls(outs):
        gemm(a, b, out=outs[0])
        gemm(x, y, out=outs[1], **SPLIT_K)

    captured = [torch.empty(300, 256, device="cuda"), torch.empty(64, 1024, device="cuda")]
    eager = [torch.empty_like(t) for t in captured]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and plan before capturing
        calls(captured)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls(captured)
    refs = [a.double() @ b.double(), x.double() @ y.double()]
    for _ in range(3):
        for t in captured + eager:
            t.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        with torch.cuda.stream(side):
            calls(eager)
        torch.cuda.synchronize()
        for got, ref in zip(captured + eager, refs + refs):
            assert _rel(torch, got, ref) < 1e-2


# --- stream churn --------------------------------------------------------------------------

ROUNDS, THREADS = 100, 8
FLAT_BYTES = 64 << 20


class _Job:
    """One product that takes scratch, with fixed operands, its output and its checked first
    result, all made on the thread's fixed stream."""

    def __init__(self, torch, gen, M, N, K, **kw):
        self.a, self.b = _bf16(torch, M, K, gen=gen), _bf16(torch, K, N, gen=gen)
        self.out = torch.full((M, N), float("nan"), device="cuda")
        self.kw, self.first = kw, None

    def run(self, stream):
        gemm(self.a, self.b, out=self.out, stream=stream, **self.kw)

    def check(self, torch):
        """Whether the result is right: near float64 in the first round, then bitwise the first."""
        if self.first is None:
            self.first = self.out.clone()
            return _rel(torch, self.out, self.a.double() @ self.b.double()) < 1e-3
        return torch.equal(self.out, self.first)


def _churn_worker(torch, device, seed, rounds, done):
    """Each round: a new stream, the jobs on it, the stream destroyed; the results checked and
    reset on the thread's fixed stream."""
    try:
        bind_primary_context(device)
        fixed = torch.cuda.Stream()
        with torch.cuda.stream(fixed):
            gen = torch.Generator(device="cuda").manual_seed(int(seed))
            jobs = [_Job(torch, gen, 300, 256, 1001), _Job(torch, gen, 64, 1024, 4096, **SPLIT_K)]
            fixed.synchronize()
            while rounds.get() is not None:
                stream = _new_stream()
                for job in jobs:
                    job.run(stream)
                (err,) = driver.cuStreamSynchronize(stream)
                _destroy(stream)
                wrong = sum(not job.check(torch) for job in jobs)
                for job in jobs:
                    job.out.fill_(float("nan"))
                fixed.synchronize()
                done.put((err, wrong))
    except Exception as exc:  # reported by the main thread
        done.put((exc, None))


def _memory(torch, device):
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    return {"free": torch.cuda.mem_get_info()[0], "torch_reserved": stats["reserved_bytes.all.current"],
            "torch_allocated": stats["allocated_bytes.all.current"], "scratch_pool": scratch_pool_bytes(device)[0]}


@pytest.mark.serial  # it reads the device's free memory, which other test processes change
def test_memory_stays_flat_under_stream_churn(torch):
    """100 rounds of 8 threads, each on a stream of its own made for the round and destroyed
    after it, running products that take scratch: every result right, and the memory after
    round 100 within 64 MiB of that after round 1 (the device's free memory, torch's allocator,
    the scratch pool). References and checks run on one fixed stream per thread, so that torch's
    own per-stream state (cuBLAS workspaces, cached blocks) is made once."""
    device = torch.cuda.current_device()
    inboxes, done = [queue.Queue() for _ in range(THREADS)], queue.Queue()
    threads = [threading.Thread(target=_churn_worker, args=(torch, device, seed, inbox, done), daemon=True)
               for seed, inbox in zip(np.random.SeedSequence().generate_state(THREADS), inboxes)]
    for t in threads:
        t.start()
    figures = {}
    try:
        for r in range(1, ROUNDS + 1):
            for inbox in inboxes:
                inbox.put(r)
            results = [done.get(timeout=600) for _ in threads]
            failures = [(err, wrong) for err, wrong in results if err != OK or wrong]
            assert not failures, f"round {r}: {failures}"
            if r in (1, ROUNDS):
                figures[r] = _memory(torch, device)
    finally:
        for inbox in inboxes:
            inbox.put(None)
        for t in threads:
            t.join(timeout=60)
    first, last = figures[1], figures[ROUNDS]
    print(f"stream churn, {ROUNDS} rounds x {THREADS} threads, MiB after round 1 -> {ROUNDS}: " +
          ", ".join(f"{k} {first[k] / 2**20:.1f} -> {last[k] / 2**20:.1f}" for k in first))
    assert first["free"] - last["free"] < FLAT_BYTES, (first, last)
    for key in ("torch_reserved", "scratch_pool"):
        assert last[key] - first[key] < FLAT_BYTES, (key, first, last)
