"""numba_hopper.attention on a Hopper GPU: results against float64 and SDPA, every head dim, causal
alignments, GQA, packed batches, masked rows, strides, the PyTorch op, torch.compile, CUDA graphs
and a transformers model.

    python -m pytest -q -n 0 tests/test_attention_gpu.py

The module first compiles the tuned kernels (every head dim, bf16 and fp16) in parallel worker
processes into the kernel cache, then every test reuses them. A table of the measured errors is
printed at the end.
"""

import contextlib
import importlib
import itertools
import math
import time

import pytest

torch = pytest.importorskip("torch")

import numba_hopper  # noqa: E402
from numba_hopper.attention import AttentionConfig, precompile  # noqa: E402
from numba_hopper.runtime.device import hopper_device_reason  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1.2e-2, torch.float16: 3e-3}  # relative Frobenius error against float64
RESULTS = []


@pytest.fixture(scope="module", autouse=True)
def kernels(request):
    if hopper_device_reason() is None:
        precompile()
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and RESULTS:
        reporter.write_line("")
        reporter.write_line(f"{'attention case':58} {'rel err':>9} {'sdpa err':>9} {'lse err':>9}")
        for case, err, sdpa_err, lse_err in RESULTS:
            reporter.write_line(f"{case:58} {err:9.2e} {sdpa_err:9.2e} {lse_err:9.2e}")


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def reference(q, k, v, causal, bottom_right, scale):
    """float64 ``(out, lse)`` of dense (B, H, S, D) inputs; rows that see no key: 0 and -inf."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    s = q.double() @ k64.transpose(-1, -2) * scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + (sk - sq if bottom_right else 0), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p @ v64, lse


def rel_err(got, ref):
    den = ref.norm().item()
    diff = (got.double() - ref).norm().item()
    return diff / den if den else diff


def lse_err(got, ref):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), "rows without keys must have lse -inf"
    if not finite.any():
        return 0.0
    return (got[finite].double() - ref[finite]).abs().max().item()


def sdpa_math(q, k, v, causal):
    """SDPA's math backend (top-left causal), GQA expanded."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=causal)


def check(case, q, k, v, causal=False, align="bottom_right", scale=None, out=None, sdpa=True, config=None):
    """Run and compare to float64 (and to SDPA's math backend where its causal mask is ours)."""
    scale_v = scale or 1.0 / math.sqrt(q.shape[-1])
    got, lse = numba_hopper.attention(q, k, v, causal=causal, causal_align=align, scale=scale, return_lse=True,
                                      out=out, config=config)
    torch.cuda.synchronize()
    ref, ref_lse = reference(q, k, v, causal, align == "bottom_right", scale_v)
    assert not torch.isnan(got).any(), f"{case}: NaN in the output"
    err, l_err = rel_err(got, ref), lse_err(lse, ref_lse)
    sdpa_err = float("nan")
    same_mask = not causal or align == "top_left" or q.shape[2] == k.shape[2]
    if sdpa and same_mask and not torch.isneginf(ref_lse).any():
        sdpa_err = rel_err(sdpa_math(q, k, v, causal), ref)
    RESULTS.append((case, err, sdpa_err, l_err))
    assert err < TOL[q.dtype], f"{case}: relative error {err:.2e}"
    if sdpa_err == sdpa_err:
        assert err < 3 * sdpa_err + 2e-3, f"{case}: error {err:.2e}, SDPA math's {sdpa_err:.2e}"
    assert l_err < 2e-3, f"{case}: log-sum-exp error {l_err:.2e}"
    return got, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [1, 7, 127, 129, 1000, 4097])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_dense_bf16(head_dim, seqlen, causal):
    batch, heads = (1, 2) if seqlen > 1000 else (2, 3)
    q, k, v = (_rand(batch, heads, seqlen, head_dim) for _ in range(3))
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    check(f"bf16 d{head_dim} s{seqlen} {'causal' if causal else 'full'}", q, k, v, causal, out=out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [129, 1000])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_dense_fp16(head_dim, seqlen, causal):
    q, k, v = (_rand(2, 2, seqlen, head_dim, dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    check(f"fp16 d{head_dim} s{seqlen} {'causal' if causal else 'full'}", q, k, v, causal, out=out)


# Configurations other than the tuned ones (``config=``): wider key blocks with late Q release,
# three consumers with narrow blocks, the output staged in Q's buffer at head dim 128, and every
# exponential on the FMA pipe.
CONFIGS = [AttentionConfig(64, block_n=192, stages=3, early_q_release=False),
           AttentionConfig(64, consumers=3, block_n=96, stages=3),
           AttentionConfig(128, block_n=176, o_aliases_q=True, early_q_release=False),
           AttentionConfig(128, exp2_fma_eighths=8)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", CONFIGS,
                         ids=lambda c: f"d{c.head_dim}-c{c.consumers}-n{c.block_n}-e{c.exp2_fma_eighths}")
def test_explicit_configs(config, causal):
    q, k, v = (_rand(2, 3, 1000, config.head_dim) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    check(f"config d{config.head_dim} c{config.consumers} n{config.block_n} {'causal' if causal else 'full'}",
          q, k, v, causal, out=out, config=config)


@pytest.mark.parametrize("walk", ["balanced", "paired"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_causal_walks_of_many_tiles_a_cta(head_dim, walk, monkeypatch):
    """A causal launch of eight tiles a CTA, the last partial: through the balanced schedule
    (the default for dense calls), and through the paired walk of launches without one."""
    api = importlib.import_module("numba_hopper.attention.api")
    if walk == "paired":
        monkeypatch.setattr(api, "MAX_SCHEDULED_TILES", 0)
    api.clear_plans()
    try:
        q, k, v = (_rand(2, 33, 2000, head_dim) for _ in range(3))  # 66 x 16 tiles of 128 rows
        out = torch.full_like(q, float("nan"))
        check(f"causal d{head_dim} 2x33x2000 {walk}", q, k, v, True, out=out)
    finally:
        api.clear_plans()


def test_a_new_causal_layout_never_waits_for_the_gpu():
    """The first call of a layout makes its balanced schedule's table, and still returns while
    the GPU is busy with work queued before it."""
    api = importlib.import_module("numba_hopper.attention.api")
    numba_hopper.attention(*(_rand(1, 4, 300, 128) for _ in range(3)), causal=True)  # the kernel is loaded
    q, k, v = (_rand(3, 41, 1900, 128) for _ in range(3))  # a layout, and a schedule, new to the process
    schedules = len(api._schedules)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning on the current stream
    gate = torch.cuda.Event()
    gate.record()
    start = time.perf_counter()
    got = numba_hopper.attention(q, k, v, causal=True)
    host = time.perf_counter() - start
    assert not gate.query(), "the call returned only after the queued sleep had finished"
    assert host < 0.2 and len(api._schedules) == schedules + 1, host
    torch.cuda.synchronize()
    ref, _ = reference(q[:1], k[:1], v[:1], True, True, 1 / math.sqrt(128))
    assert rel_err(got[:1], ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("sq, sk", [(100, 300), (300, 100), (1, 129), (129, 1), (1000, 4097), (257, 256)])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_causal_unequal_lengths(head_dim, sq, sk, align):
    q = _rand(2, 2, sq, head_dim)
    k, v = _rand(2, 2, sk, head_dim), _rand(2, 2, sk, head_dim)
    got, lse = check(f"causal {align} d{head_dim} q{sq} k{sk}", q, k, v, True, align)
    if align == "bottom_right" and sq > sk:  # the first sq - sk rows see no key: 0 and -inf
        assert torch.all(got[:, :, :sq - sk] == 0) and torch.all(torch.isneginf(lse[:, :, :sq - sk]))


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(heads, kv_heads, causal):
    q = _rand(2, heads, 333, 128)
    k, v = _rand(2, kv_heads, 333, 128), _rand(2, kv_heads, 333, 128)
    check(f"gqa {heads}:{kv_heads} {'causal' if causal else 'full'}", q, k, v, causal)


def test_scale_and_no_keys():
    q, k, v = _rand(1, 2, 200, 64), _rand(1, 2, 300, 64), _rand(1, 2, 300, 64)
    check("scale 0.05", q, k, v, scale=0.05)
    out, lse = numba_hopper.attention(q, k[:, :, :0], v[:, :, :0], return_lse=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


@pytest.mark.parametrize("causal, align", [(False, "bottom_right"), (True, "bottom_right"), (True, "top_left")])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_varlen(head_dim, causal, align):
    lens_q = [0, 1, 300, 129, 7, 128]
    lens_k = [5, 1, 200, 0, 300, 128]
    heads, kv_heads = 4, 2
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    q = _rand(sum(lens_q), heads, head_dim)
    k, v = _rand(sum(lens_k), kv_heads, head_dim), _rand(sum(lens_k), kv_heads, head_dim)
    out = torch.full_like(q, float("nan"))
    got, lse = numba_hopper.attention(q, k, v, causal=causal, causal_align=align, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), return_lse=True, out=out)
    torch.cuda.synchronize()
    assert lse.shape == (heads, sum(lens_q))
    worst, worst_lse = 0.0, 0.0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if lq == 0:
            continue
        if lk == 0:
            assert torch.all(got[rows] == 0) and torch.all(torch.isneginf(lse[:, rows]))
            continue
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        as_dense = lambda t, r: t[r].transpose(0, 1)[None]  # noqa: E731
        ref, ref_lse = reference(as_dense(q, rows), as_dense(k, keys), as_dense(v, keys), causal,
                                 align == "bottom_right", 1 / math.sqrt(head_dim))
        worst = max(worst, rel_err(as_dense(got, rows), ref))
        worst_lse = max(worst_lse, lse_err(lse[:, rows][None], ref_lse))
    RESULTS.append((f"varlen d{head_dim} {'causal ' + align if causal else 'full'}", worst, float("nan"), worst_lse))
    assert worst < TOL[torch.bfloat16] and worst_lse < 2e-3
    assert not torch.isnan(got).any()


def test_strided_inputs_and_output():
    """(batch, seq, heads, head_dim) projections viewed as SDPA's layout are read in place; an
    output in that layout is written in place; a head dim that is not contiguous is copied."""
    b, s, h, d = 2, 517, 4, 128
    q, k, v = (_rand(b, s, h, d).transpose(1, 2) for _ in range(3))
    out = torch.full((b, s, h, d), float("nan"), dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    check("strided (b, s, h, d) views", q, k, v, True, out=out)
    wide = _rand(b, h, s, 2 * d)
    check("non-contiguous head dim (copied)", wide[..., ::2], k, v)


def test_bad_input_on_the_gpu():
    q = _rand(1, 2, 64, 128)
    with pytest.raises(numba_hopper.ShapeError):
        numba_hopper.attention(q, _rand(1, 3, 64, 128), _rand(1, 3, 64, 128))
    with pytest.raises(numba_hopper.DtypeError):
        numba_hopper.attention(q, q.half(), q)
    with pytest.raises(numba_hopper.LayoutError):
        numba_hopper.attention(q, q, q, out=_rand(1, 2, 64, 256)[..., ::2])


def test_sdpa_drop_in():
    import numba_hopper.torch as nht

    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = _rand(2, 8, 300, 128), _rand(2, 2, 500, 128), _rand(2, 2, 500, 128)
    for causal in (False, True):
        ours = nht.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        ref, _ = reference(q, k, v, causal, False, 1 / math.sqrt(128))
        err = rel_err(ours, ref)
        RESULTS.append((f"nht.sdpa gqa top-left causal={causal}", err, rel_err(sdpa(q, k, v, is_causal=causal,
                                                                                      enable_gqa=True), ref), 0.0))
        assert err < TOL[torch.bfloat16]
    mask = torch.rand(2, 1, 300, 500, device="cuda") > 0.3  # falls back to torch: the same result
    kk, vv = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    assert torch.equal(nht.scaled_dot_product_attention(q, kk, vv, attn_mask=mask), sdpa(q, kk, vv, attn_mask=mask))


def test_custom_op_opcheck():
    import numba_hopper.torch  # noqa: F401  (registers the op)

    q, k, v = _rand(1, 2, 130, 64), _rand(1, 1, 200, 64), _rand(1, 1, 200, 64)
    # (forward only: no autograd formula to check)
    torch.library.opcheck(torch.ops.numba_hopper.attention.default, (q, k, v, True, "top_left", None, None, None,
                                                                      None, None, True),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_torch_compile_and_cuda_graph():
    import numba_hopper.torch as nht

    q, k, v = _rand(2, 4, 256, 64), _rand(2, 4, 256, 64), _rand(2, 4, 256, 64)

    def layer(q, k, v):
        return nht.scaled_dot_product_attention(q * 1.0, k, v, is_causal=True)

    compiled = torch.compile(layer, fullgraph=True)
    ref, _ = reference(q, k, v, True, False, 1 / 8)
    assert rel_err(compiled(q, k, v), ref) < TOL[torch.bfloat16]
    static = [t.clone() for t in (q, k, v)]
    layer(*static)  # warm-up (plans, kernels)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(*static)
    fresh = [_rand(2, 4, 256, 64) for _ in range(3)]
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = reference(*fresh, True, False, 1 / 8)
    err = rel_err(out, ref)
    RESULTS.append(("CUDA graph replay, new inputs", err, float("nan"), 0.0))
    assert err < TOL[torch.bfloat16]


LLAMA_LAYERS = 2


def _llama_on_both_backends():
    """A small transformers Llama, the name of numba_hopper's attention backend and a batch of ids."""
    transformers = pytest.importorskip("transformers")
    import numba_hopper.torch as nht

    name = nht.register_transformers_attention()
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=LLAMA_LAYERS,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    return model, name, torch.randint(0, 1000, (2, 300), device="cuda")


def _sdpa_logits(model, ids):
    implementation = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        return model(ids).logits.float()
    finally:
        model.set_attn_implementation(implementation)


@contextlib.contextmanager
def _counting_attention_calls(calls):
    """``numba_hopper.torch.attention.attention`` counting its calls in ``calls``."""
    import numba_hopper.torch as nht

    original = nht.attention.attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    nht.attention.attention = counted
    try:
        yield
    finally:
        nht.attention.attention = original


def _check_logits(case, got, ref):
    err = ((got - ref).norm() / ref.norm()).item()
    RESULTS.append((case, err, float("nan"), 0.0))
    assert err < 2e-2, case


def test_transformers_llama_routes_attention():
    model, name, ids = _llama_on_both_backends()
    calls = []
    with torch.no_grad():
        ref = _sdpa_logits(model, ids)
        model.set_attn_implementation(name)
        with _counting_attention_calls(calls):
            got = model(ids).logits.float()
    assert len(calls) == LLAMA_LAYERS, "every layer's attention must run on numba_hopper"
    _check_logits("transformers Llama logits vs sdpa", got, ref)


def test_transformers_llama_routes_attention_compiled_and_in_cuda_graphs():
    """Traced, transformers' SDPA mask builder may build the causal mask for every call; the
    backend's own builder leaves it out, so the kernel runs there too."""
    model, name, ids = _llama_on_both_backends()
    model.set_attn_implementation(name)
    traced_ops = []

    def counting_backend(gm, example_inputs):
        traced_ops.extend(n for n in gm.graph.nodes if n.target is torch.ops.numba_hopper.attention.default)
        return gm.forward

    with torch.no_grad():
        ref = _sdpa_logits(model, ids)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=counting_backend, dynamic=False)
        _check_logits("transformers Llama compiled, logits vs sdpa", compiled(ids).logits.float(), ref)
        assert len(traced_ops) == LLAMA_LAYERS, "the compiled graph must call numba_hopper::attention in every layer"
        torch._dynamo.reset()

        static_ids = ids.clone()
        model(static_ids)  # warm-up
        torch.cuda.synchronize()
        graph, captured = torch.cuda.CUDAGraph(), []
        with _counting_attention_calls(captured), torch.cuda.graph(graph):
            logits = model(static_ids).logits
        assert len(captured) == LLAMA_LAYERS, "the captured forward must run numba_hopper's attention in every layer"
        fresh = torch.randint(0, 1000, ids.shape, device="cuda")
        static_ids.copy_(fresh)
        graph.replay()
        _check_logits("transformers Llama CUDA graph replay, new ids, vs sdpa", logits.float(),
                      _sdpa_logits(model, fresh))
