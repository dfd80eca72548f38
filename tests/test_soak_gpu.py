"""A soak of the GPU: threads x streams x random operations for a minute, run only when asked:

    pytest -m soak tests/test_soak_gpu.py -n 0 -s

Each of ``THREADS`` threads draws operations at random (``OPS``), runs each on one of its
``STREAMS`` streams and checks every result against float64 computed on a stream of its
own: one fixed stream per thread, so torch's per-stream state (cuBLAS workspaces, cached
blocks) is made once, not per operation. The operations: gemm, plain (every layout, narrow
decode tiles, aligned copies, split-K, stream-K) and with fused epilogues (bias per column and
per row, activations, ``c``/``beta``, ``aux_out``, row and column scales); fp8 gemm with
per-tensor (numbers and device scalars), row-wise and block-wise scales; grouped GEMMs, bf16
and fp8, contiguous and masked; bmm; ``numba_hopper.torch.linear`` forward and backward;
``numba_hopper.attention`` (causal and not, GQA and MQA, head dims 64, 128 and 256).
Every variant runs once before the clock starts (compiling its kernels, or loading them from
the disk cache). Memory, sampled every second, must stay flat: the device memory held outside
torch's caching allocator (the scratch pool, modules, descriptors) and the scratch pool may not
peak higher in the second half than in the first by 64 MiB or more, and the bytes of live torch
tensors, with every thread done (and PyTorch's per-stream cuBLAS workspaces let go of), may not
exceed those before the threads started by as much.
The figures (``calls``: operations, a linear's forward and backward being one) are printed
and written to a JSON file.

Settings, from the environment: ``NUMBA_HOPPER_SOAK_SECONDS`` (60), ``NUMBA_HOPPER_SOAK_THREADS``
(8), ``NUMBA_HOPPER_SOAK_STREAMS`` (streams per thread, 2) and ``NUMBA_HOPPER_SOAK_JSON``, where the
figures are written (default ``benchmarks/results/soak-<gpu>.json``, e.g. ``soak-h200.json``).
"""

import functools
import gc
import json
import os
import pathlib
import re
import threading
import time
from typing import Callable, NamedTuple

import numpy as np
import pytest

import numba_hopper
from numba_hopper import GemmConfig, bmm, gemm, grouped_gemm
from numba_hopper.runtime.workspace import bind_primary_context, scratch_pool_bytes


pytestmark = [pytest.mark.gpu, pytest.mark.soak]

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECONDS = float(os.environ.get("NUMBA_HOPPER_SOAK_SECONDS", "60"))
THREADS = int(os.environ.get("NUMBA_HOPPER_SOAK_THREADS", "8"))
STREAMS = int(os.environ.get("NUMBA_HOPPER_SOAK_STREAMS", "2"))
CHECK_EVERY = 8  # operations a thread queues between two waits for its checks
SAMPLE_S = 1.0  # the memory sampling period
FLAT_BYTES = 64 << 20

# Relative Frobenius error bounds: 16-bit output rounding with room (tests/test_gemm_gpu.py);
# fp8 (tests/test_fp8_gpu.py): the rounding plus 3e-4 for block-wise scales; the other scalings
# keep use_fast_accum's looser 6.4e-7 * K, which their promoted default meets with room (the fp8
# tests check its 3e-4).
TOL = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-4}
FP8_ROUNDING = {"bf16": 5e-3, "f16": 1e-3, "f32": 1e-3}
GRAD_TOL = 2e-2
SPLIT_K = dict(config=GemmConfig(block_m=64, block_n=128), split_k=3)  # gemm's keywords
STREAM_K = dict(config=GemmConfig(block_n=128, stream_k=True))


@pytest.fixture(autouse=True)
def _only_when_selected(request):
    """Not part of the GPU suite: runs only when the marker expression names ``soak``
    (``-m soak``; an expression with ``not soak`` deselects it before this is reached)."""
    if not re.search(r"\bsoak\b", request.config.getoption("markexpr") or ""):
        pytest.skip("the soak runs only when selected: pytest -m soak tests/test_soak_gpu.py")


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


class Case(NamedTuple):
    """One operation on fresh data (made on the current stream when the variant is called)."""

    run: Callable  # () -> [results]: numba_hopper's calls, on the current stream
    refs: Callable  # () -> [(float64 reference, bound)], one per result, on the current stream


def _dtype(torch, name):
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "e4m3": torch.float8_e4m3fn}[name]


def _randn(torch, gen, *shape, dtype="bf16", scale=1.0):
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(_dtype(torch, dtype))


def _rand_scales(torch, gen, *shape):
    """Positive float32 scales in [0.5, 1.5)."""
    return torch.rand(*shape, generator=gen, device="cuda") + 0.5


def _major(x, major):
    """``x``'s values, row-major ("R") or column-major ("C")."""
    return x if major == "R" else x.t().contiguous().t()


def _nan(torch, *shape, dtype="bf16"):
    return torch.full(shape, float("nan"), device="cuda", dtype=_dtype(torch, dtype))


def _activation(torch, name):
    F = torch.nn.functional
    return {None: lambda z: z, "relu": torch.relu, "gelu": F.gelu,
            "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu,
            "sigmoid": torch.sigmoid}[name]


# --- the operations ---------------------------------------------------------------------------


def gemm_plain(torch, gen, rng, M, N, K, layout, dtype, out_dtype, kw=None):
    a = _major(_randn(torch, gen, M, K, dtype=dtype), layout[0])
    b = _major(_randn(torch, gen, K, N, dtype=dtype), layout[1])
    out = _nan(torch, M, N, dtype=out_dtype) if rng.random() < 0.5 else None  # else a fresh output
    return Case(lambda: [gemm(a, b, out=out, out_dtype=out_dtype, **(kw or {}))],
                lambda: [(a.double() @ b.double(), TOL[out_dtype])])


def gemm_epilogue(torch, gen, rng, M, N, K, alpha=1.0, beta=0.0, c=None, bias=None, activation=None, aux=False,
                  scales=False):
    """``act(alpha * row_scale * col_scale * (a @ b) + beta * c + bias)`` (bias: "col" or "row"),
    bf16 output, b as ``w.t()`` or row-major at random."""
    a = _randn(torch, gen, M, K)
    b = _major(_randn(torch, gen, K, N), "RC"[int(rng.integers(2))])
    kw = dict(alpha=alpha, activation=activation)
    if c is not None:
        kw.update(c=_randn(torch, gen, M, N, dtype=c), beta=beta)
    if bias is not None:
        kw.update(bias=_randn(torch, gen, N if bias == "col" else M, dtype="f32"), bias_dim=int(bias == "col"))
    if scales:
        kw.update(row_scale=_rand_scales(torch, gen, M), col_scale=_rand_scales(torch, gen, N))
    if aux:
        kw.update(aux_out=_nan(torch, M, N))
    out = _nan(torch, M, N)

    def refs():
        z = alpha * (a.double() @ b.double())
        if scales:
            z = z * kw["row_scale"].double()[:, None] * kw["col_scale"].double()[None, :]
        if c is not None:
            z = z + beta * kw["c"].double()
        if bias is not None:
            z = z + (kw["bias"].double()[None, :] if bias == "col" else kw["bias"].double()[:, None])
        return [(_activation(torch, activation)(z), TOL["bf16"])] + ([(z, TOL["bf16"])] if aux else [])

    return Case(lambda: [gemm(a, b, out=out, **kw)] + ([kw["aux_out"]] if aux else []), refs)


def gemm_fp8(torch, gen, rng, scaling, M, N, K, out_dtype="bf16"):
    """e4m3 ``a`` (M, K) and ``b = w.t()`` (TN), scaled per tensor ("number", "scalar": a
    one-element device array), per row/column ("rowwise") or per block ("block")."""
    a = _randn(torch, gen, M, K, dtype="e4m3", scale=2.0)
    b = _randn(torch, gen, N, K, dtype="e4m3", scale=0.5).t()
    kb, nb = -(-K // 128), -(-N // 128)
    if scaling == "number":
        sa, sb = float(rng.uniform(0.5, 2)), float(rng.uniform(0.5, 2))
    elif scaling == "scalar":
        sa, sb = _rand_scales(torch, gen, 1), _rand_scales(torch, gen, 1)
    elif scaling == "rowwise":
        sa, sb = _rand_scales(torch, gen, M), _rand_scales(torch, gen, N)
    else:  # block-wise, in torch._scaled_mm's strides
        sa, sb = _rand_scales(torch, gen, kb, M).t(), _rand_scales(torch, gen, nb, kb).t()

    def refs():
        ad, bd = a.double(), b.double()
        if scaling == "block":
            ad = ad * sa.double().repeat_interleave(128, 1)[:, :K]
            bd = bd * sb.double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
            return [(ad @ bd, FP8_ROUNDING[out_dtype] + 3e-4)]
        s_a, s_b = (torch.as_tensor(s, device="cuda").double() for s in (sa, sb))
        ad = ad * (s_a[:, None] if s_a.numel() > 1 else s_a)
        bd = bd * (s_b[None, :] if s_b.numel() > 1 else s_b)
        return [(ad @ bd, FP8_ROUNDING[out_dtype] + 6.4e-7 * K)]

    return Case(lambda: [gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)], refs)


def _group_sizes(rng, G, most):
    return [int(n) for n in rng.integers(0, most + 1, G)]


def grouped(torch, gen, rng, masked, fp8, G, M, N, K, row_scale=False, activation=None):
    """Contiguous (rows of up to ``M`` per group, 37 rows past the last) or masked (G, M) groups,
    bf16 (``b[g]`` row- or column-major at random, an optional row scale and activation) or fp8
    with block-wise scales (``b = w.transpose(1, 2)``); each group's rows checked."""
    sizes = _group_sizes(rng, G, M)
    rows = M if masked else sum(sizes) + 37
    a_shape = (G, M, K) if masked else (rows, K)
    kb, nb = -(-K // 128), -(-N // 128)
    kw = {}
    if fp8:
        a = _randn(torch, gen, *a_shape, dtype="e4m3", scale=2.0)
        b = _randn(torch, gen, G, N, K, dtype="e4m3", scale=0.5).transpose(1, 2)
        kw.update(scale_a=_rand_scales(torch, gen, *a_shape[:-2], kb, a_shape[-2]).transpose(-1, -2),
                  scale_b=_rand_scales(torch, gen, G, nb, kb).transpose(1, 2))
    else:
        a = _randn(torch, gen, *a_shape)
        b = _randn(torch, gen, G, K, N) if rng.random() < 0.5 else _randn(torch, gen, G, N, K).transpose(1, 2)
        if row_scale:
            kw.update(row_scale=_rand_scales(torch, gen, *a_shape[:-1]), activation=activation)
    group_rows = torch.tensor(sizes if masked else np.cumsum(sizes).tolist(), device="cuda", dtype=torch.int32)
    out = _nan(torch, *a_shape[:-1], N)
    starts = [0] * G if masked else np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()
    parts = [(g, start, n) for g, (start, n) in enumerate(zip(starts, sizes)) if n]

    def take(x, g, start, n):  # group g's rows of an (rows, ...) or (G, M, ...) array
        return x[g, :n] if masked else x[start:start + n]

    def run():
        call = dict(masked_m=group_rows) if masked else dict(offsets=group_rows)
        grouped_gemm(a, b, out=out, **call, **kw)
        return [take(out, *p) for p in parts]

    def refs():
        result = []
        for g, start, n in parts:
            ad, bd = take(a, g, start, n).double(), b[g].double()
            if fp8:
                ad = ad * take(kw["scale_a"], g, start, n).double().repeat_interleave(128, 1)[:, :K]
                bd = bd * kw["scale_b"][g].double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
            z = ad @ bd
            if row_scale:
                z = _activation(torch, activation)(z * take(kw["row_scale"], g, start, n).double()[:, None])
            result.append((z, FP8_ROUNDING["bf16"] + 3e-4 if fp8 else TOL["bf16"]))
        return result

    return Case(run, refs)


def batched(torch, gen, rng, B, M, N, K, dtype, broadcast_b=False):
    a = _randn(torch, gen, B, M, K, dtype=dtype)
    b = _randn(torch, gen, 1, K, N, dtype=dtype).expand(B, K, N) if broadcast_b else _randn(torch, gen, B, K, N,
                                                                                            dtype=dtype)
    return Case(lambda: [bmm(a, b)], lambda: [(a.double() @ b.double(), TOL[dtype])])


def linear(torch, gen, rng, x_shape, out_features, bias, activation):
    """``numba_hopper.torch.linear`` forward and backward (y, dx, dw, db) against torch's autograd in float64."""
    import numba_hopper.torch as nht

    in_features = x_shape[-1]
    x = _randn(torch, gen, *x_shape).requires_grad_()
    w = _randn(torch, gen, out_features, in_features, scale=in_features ** -0.5).requires_grad_()
    b = _randn(torch, gen, out_features).requires_grad_() if bias else None
    leaves = [t for t in (x, w, b) if t is not None]
    dy = _randn(torch, gen, *x_shape[:-1], out_features)

    def run():
        y = nht.linear(x, w, b, activation=activation)
        return [y.detach(), *torch.autograd.grad(y, leaves, dy)]

    def refs():
        ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
        y = _activation(torch, activation)(torch.nn.functional.linear(*ref_leaves))
        grads = torch.autograd.grad(y, ref_leaves, dy.double())
        return [(y.detach(), TOL["bf16"])] + [(g, GRAD_TOL) for g in grads]

    return Case(run, refs)


def attention(torch, gen, rng, batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal):
    """``numba_hopper.attention`` (causal aligned to the bottom right) against softmax attention
    in float64."""
    q = _randn(torch, gen, batch, heads, seqlen_q, head_dim)
    k, v = (_randn(torch, gen, batch, kv_heads, seqlen_k, head_dim) for _ in range(2))

    def run():
        return [numba_hopper.attention(q, k, v, causal=causal)]

    def refs():
        kd, vd = (x.double().repeat_interleave(heads // kv_heads, 1) for x in (k, v))
        s = q.double() @ kd.transpose(-1, -2) * head_dim ** -0.5
        if causal:  # (seqlen_q <= seqlen_k: every row sees a key)
            rows = torch.arange(seqlen_q, device="cuda")[:, None] + (seqlen_k - seqlen_q)
            s = s.masked_fill(torch.arange(seqlen_k, device="cuda")[None, :] > rows, float("-inf"))
        return [(torch.softmax(s, -1) @ vd, TOL["bf16"])]

    return Case(run, refs)


def _variants(fn, *rows):
    """``fn``'s variants, ``variant(torch, gen, rng)``: one per row of its further arguments (a
    tuple, or a dict of keywords)."""
    def variant(row):
        args, kw = ((), row) if isinstance(row, dict) else (row, {})
        return lambda torch, gen, rng: fn(torch, gen, rng, *args, **kw)

    return [variant(row) for row in rows]


# Each operation's variants: a fixed set of shapes and options (so that the kernels they need
# are compiled once, before the clock), called with fresh random data every time.
OPS = {
    "gemm": _variants(
        gemm_plain,
        (1000, 1000, 1000, "RR", "bf16", "bf16"),
        (129, 513, 64, "RC", "f16", "f32"),
        (7, 4096, 4096, "RC", "bf16", "bf16"),  # decode: the narrow tile, swapped
        (300, 1001, 777, "CC", "bf16", "bf16"),  # an odd N: out through aligned scratch
        (300, 256, 1001, "RR", "bf16", "f32"),  # a's rows of 2002 bytes: a copied to aligned scratch
        (64, 1024, 4096, "RR", "bf16", "f32", SPLIT_K),
        (1000, 1000, 2048, "RR", "bf16", "f32", STREAM_K)),
    "gemm_epilogue": _variants(
        gemm_epilogue,
        dict(M=1000, N=768, K=512, bias="col", activation="gelu_tanh"),
        dict(M=129, N=1000, K=264, alpha=0.5, c="bf16", beta=0.75),
        dict(M=512, N=256, K=1000, bias="row", activation="relu", aux=True),
        dict(M=7, N=136, K=1000, scales=True, activation="silu"),
        dict(M=1000, N=136, K=256, c="f32", beta=-1.0, bias="col", aux=True, activation="sigmoid"),
        dict(M=300, N=520, K=270, alpha=2.0, scales=True, bias="col", activation="gelu")),
    "fp8": _variants(
        gemm_fp8,
        ("number", 1000, 1024, 2048),
        ("scalar", 129, 256, 512, "f32"),
        ("rowwise", 1000, 1500, 2048),
        ("block", 1000, 1000, 1104),
        ("block", 7, 2048, 4096)),
    "grouped": _variants(
        grouped,
        dict(masked=False, fp8=False, G=4, M=300, N=320, K=200),
        dict(masked=False, fp8=False, G=6, M=200, N=256, K=512, row_scale=True, activation="silu"),
        dict(masked=True, fp8=False, G=4, M=256, N=512, K=384)),
    "grouped_fp8": _variants(
        grouped,
        dict(masked=False, fp8=True, G=4, M=300, N=320, K=656),
        dict(masked=True, fp8=True, G=4, M=256, N=512, K=384)),
    "bmm": _variants(
        batched,
        (4, 129, 264, 200, "bf16"),
        (8, 64, 256, 512, "f16", True)),
    "linear": _variants(
        linear,
        ((4, 33, 512), 768, True, "gelu_tanh"),
        ((257, 1024), 1024, False, None),
        ((7, 256), 128, True, "relu")),
    "attention": _variants(
        attention,
        (2, 8, 2, 1000, 1000, 128, True),  # GQA 4:1
        (1, 4, 4, 129, 300, 64, True),  # seqlen_q < seqlen_k
        (3, 4, 1, 257, 257, 256, False)),  # MQA
}


# --- the soak ----------------------------------------------------------------------------------


class _Tally:
    """What the threads did, under a lock: operations by kind, results checked, errors and wrong
    results (each described)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = {name: 0 for name in OPS}
        self.results, self.errors, self.wrong = 0, [], []

    def add(self, name, results=0, error=None, wrong=None):
        with self.lock:
            self.calls[name] += 1
            self.results += results
            if wrong is not None:
                self.wrong.append(f"{name}: {wrong}")
        if error is not None:
            self.fail(name, error)

    def fail(self, what, error):
        with self.lock:
            self.errors.append(f"{what}: {error!r}")


def _queue(torch, rng, gen, fixed, streams, name, variant):
    """Make one operation's data on ``fixed``, run it on a random one of ``streams``, and queue
    its checks on ``fixed``: ``[(relative error, bound)]`` as device scalars."""
    with torch.cuda.stream(fixed):
        case = variant(torch, gen, rng)
    stream = streams[int(rng.integers(len(streams)))]
    stream.wait_stream(fixed)
    with torch.cuda.stream(stream):
        got = case.run()
    fixed.wait_stream(stream)
    with torch.cuda.stream(fixed):
        refs = case.refs()
        assert len(refs) == len(got), (name, len(refs), len(got))
        return case, got, [((g.double() - r).norm() / r.norm().clamp_min(1e-30), tol) for g, (r, tol) in zip(got, refs)]


def _settle(fixed, pending, tally):
    """Wait for the queued checks, count them, and let go of their tensors (every stream that
    used them is past them by then)."""
    fixed.synchronize()
    for name, (_, _, errors) in pending:
        bad = [f"relative error {e:.3g} >= {tol:.3g}" for e, tol in ((e.item(), tol) for e, tol in errors)
               if not e < tol]
        tally.add(name, results=len(errors), wrong="; ".join(bad) if bad else None)
    pending.clear()


def _soak_thread(*args):
    tally = args[-1]
    try:
        _run_ops(*args)
    except Exception as exc:  # (a failure outside an operation, e.g. a broken context: counted)
        tally.fail("thread", exc)


def _run_ops(torch, device, seed, ops, deadline, tally):
    """Operations (``ops``: (name, variant) pairs, taken in order when ``deadline`` is None, else
    drawn at random until it passes), checked."""
    bind_primary_context(device)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device="cuda").manual_seed(int(seed) % 2**63)
    fixed, streams = torch.cuda.Stream(), [torch.cuda.Stream() for _ in range(STREAMS)]
    fixed.wait_stream(torch.cuda.current_stream())
    pending, todo = [], iter(ops)
    while True:
        if deadline is None:
            name, variant = next(todo, (None, None))
            if name is None:
                break
        elif time.monotonic() < deadline:
            name, variant = ops[int(rng.integers(len(ops)))]
        else:
            break
        try:
            pending.append((name, _queue(torch, rng, gen, fixed, streams, name, variant)))
            if len(pending) >= CHECK_EVERY:
                _settle(fixed, pending, tally)
        except Exception as exc:  # counted; the thread carries on
            tally.add(name, error=exc)
            torch.cuda.synchronize()  # before the failed operation's tensors are let go of
    _settle(fixed, pending, tally)


MEMORY = ("device_used", "outside_torch", "torch_reserved", "torch_allocated", "scratch_pool")


def _sample(torch, device):
    """The device's used memory, the part of it outside torch's caching allocator, torch's
    reserved and allocated bytes, and the scratch pool's reserved bytes."""
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    reserved = stats["reserved_bytes.all.current"]
    return {"device_used": total - free, "outside_torch": total - free - reserved, "torch_reserved": reserved,
            "torch_allocated": stats["allocated_bytes.all.current"], "scratch_pool": scratch_pool_bytes(device)[0]}


def _quiet_sample(torch, device):
    """:func:`_sample` with no thread running, after a garbage collection and with PyTorch's
    cuBLAS workspaces let go of: it keeps one per stream its references have run on (32 MiB
    each on Hopper), so the soak's new streams would read as growth that is not ours."""
    gc.collect()
    torch._C._cuda_clearCublasWorkspaces()
    return _sample(torch, device)


def _growth(samples, key):
    """How far ``key``'s peak in the second half of ``samples`` is above its peak in the first."""
    half = len(samples) // 2
    return max(s[key] for s in samples[half:]) - max(s[key] for s in samples[:half])


def _json_path(torch):
    """``NUMBA_HOPPER_SOAK_JSON``, else benchmarks/results/soak-<gpu>.json ("NVIDIA H200": h200,
    as the benchmarks name their results)."""
    if "NUMBA_HOPPER_SOAK_JSON" in os.environ:
        return pathlib.Path(os.environ["NUMBA_HOPPER_SOAK_JSON"])
    name = torch.cuda.get_device_name()
    return ROOT / "benchmarks" / "results" / f"soak-{(name.split()[1:2] or [name])[0].lower()}.json"


def test_soak(torch):
    device = torch.cuda.current_device()
    ops = [(name, variant) for name, variants in OPS.items() for variant in variants]
    warm = _Tally()
    start = time.monotonic()
    _run_ops(torch, device, 0, ops, None, warm)  # every variant once: kernels compiled or loaded
    warmup_s = time.monotonic() - start
    assert not warm.errors and not warm.wrong, (warm.errors + warm.wrong)[:10]

    tally = _Tally()
    torch.cuda.synchronize()
    samples = [_quiet_sample(torch, device)]
    start = time.monotonic()
    deadline = start + SECONDS
    threads = [threading.Thread(target=_soak_thread, args=(torch, device, seed, ops, deadline, tally), daemon=True)
               for seed in np.random.SeedSequence().generate_state(THREADS)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(SAMPLE_S)
        samples.append(_sample(torch, device))
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    duration = time.monotonic() - start
    samples.append(_quiet_sample(torch, device))

    first, last = samples[0], samples[-1]  # (both with no thread running)
    figures = {
        "device": torch.cuda.get_device_name(device),
        "numba_hopper": numba_hopper.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
        "threads": THREADS, "streams_per_thread": STREAMS, "seconds_asked": SECONDS,
        "duration_s": round(duration, 1), "warmup_s": round(warmup_s, 1),
        "calls": sum(tally.calls.values()), "calls_by_operation": tally.calls, "results_checked": tally.results,
        "errors": len(tally.errors), "wrong_results": len(tally.wrong),
        "error_examples": tally.errors[:5], "wrong_examples": tally.wrong[:5],
        "memory_mib": {"start": {k: round(first[k] / 2**20, 1) for k in MEMORY},
                       "end": {k: round(last[k] / 2**20, 1) for k in MEMORY},
                       "second_half_peak_over_first": {k: round(_growth(samples, k) / 2**20, 1) for k in MEMORY}},
        "memory_samples": len(samples),
    }
    path = _json_path(torch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print(f"written to {path}")

    assert not tally.errors and not tally.wrong, (tally.errors + tally.wrong)[:10]
    assert duration >= SECONDS and all(tally.calls.values()), tally.calls
    for key in ("outside_torch", "scratch_pool"):
        assert _growth(samples, key) < FLAT_BYTES, (key, figures["memory_mib"])
    assert last["torch_allocated"] - first["torch_allocated"] < FLAT_BYTES, figures["memory_mib"]
