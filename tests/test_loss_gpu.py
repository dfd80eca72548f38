"""numba_hopper.torch.linear_cross_entropy and fuse_linear_cross_entropy on a Hopper GPU: the loss
and both gradients against float64 and against PyTorch's own computation at equal accuracy,
every reduction, ignored and invalid targets, ragged sizes, and a transformers model.

    python -m pytest -q -n 0 tests/test_loss_gpu.py
"""

import copy

import pytest

torch = pytest.importorskip("torch")

import numba_hopper.torch as nht  # noqa: E402

pytestmark = pytest.mark.gpu

F = torch.nn.functional


def rel_error(got, ref):
    diff, scale = (got.double() - ref.double()).norm().item(), ref.double().norm().item()
    return diff / scale if scale else diff


def inputs(rows, vocab, hidden, dtype, ignored=0.1):
    torch.manual_seed(rows * 7 + vocab)
    x = (torch.randn(rows, hidden, device="cuda") / hidden ** 0.25).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda") / hidden ** 0.25).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[torch.rand(rows, device="cuda") < ignored] = -100
    return x, w, target


def losses_and_grads(fn, x, w, target, reduction, seed_grad):
    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    loss = fn(x, w, target, reduction)
    loss.backward(seed_grad if reduction == "none" else None)
    return loss.detach(), x.grad, w.grad


def ours(x, w, t, reduction):
    return nht.linear_cross_entropy(x, w, t, reduction=reduction)


def torch_16bit(x, w, t, reduction):  # transformers' way: 16-bit logits, upcast, cross_entropy
    return F.cross_entropy(F.linear(x, w).float(), t, reduction=reduction)


def float64(x, w, t, reduction):  # (given float64 leaves: their gradients stay float64)
    return F.cross_entropy(F.linear(x, w), t, reduction=reduction)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("rows, vocab", [(1, 1000), (7, 32000), (127, 4097), (129, 1), (1000, 151936), (3, 262152)])
def test_loss_and_gradients_match_float64_as_closely_as_pytorch(rows, vocab, dtype, reduction):
    hidden = 256
    x, w, target = inputs(rows, vocab, hidden, dtype)
    seed = torch.randn(rows, device="cuda")
    got = losses_and_grads(ours, x, w, target, reduction, seed)
    ref = losses_and_grads(float64, x.double(), w.double(), target, reduction, seed.double())
    base = losses_and_grads(torch_16bit, x, w, target, reduction, seed)
    for name, g, r, b in zip(("loss", "dx", "dw"), got, ref, base):
        assert not torch.isnan(g).any(), name
        assert g.dtype == b.dtype and g.shape == b.shape, name
        # 16-bit rounding (the logits', the gradients') dominates both errors
        assert rel_error(g, r) <= 1.5 * rel_error(b, r) + 1e-4, (name, rel_error(g, r), rel_error(b, r))


def test_ignored_and_invalid_targets():
    x, w, target = inputs(64, 1000, 128, torch.bfloat16, ignored=0)
    target[:] = -100
    loss = nht.linear_cross_entropy(x, w, target)
    assert torch.isnan(loss)  # the mean of no target, as PyTorch
    assert torch.isnan(F.cross_entropy(F.linear(x, w).float(), target))
    total = nht.linear_cross_entropy(x, w, target, reduction="sum")
    total.backward()
    assert total.item() == 0 and x.grad.abs().max().item() == 0 and w.grad.abs().max().item() == 0
    target[0] = 1000  # outside [0, V)
    assert torch.isnan(nht.linear_cross_entropy(x, w, target, reduction="none")[0])
    custom = nht.linear_cross_entropy(x, w, torch.full_like(target, 3), ignore_index=3, reduction="sum")
    assert custom.item() == 0


@pytest.mark.parametrize("layout", ["offset", "strided"])
@pytest.mark.parametrize("vocab", [1, 9, 4097, 32000])
def test_operators_on_unaligned_logits_with_masked_columns(layout, vocab):
    """The two operators on logits that start off 16 bytes or skip columns (copied first), rows
    of every alignment, -inf (masked) columns, and a row all -inf (NaN, as PyTorch)."""
    rows = 37
    torch.manual_seed(vocab)
    full = torch.randn(rows, 2 * vocab + 1, device="cuda").to(torch.bfloat16)
    logits = full[:, 1:vocab + 1] if layout == "offset" else full[:, ::2][:, :vocab]
    logits[3, ::3] = float("-inf")
    if vocab > 1:
        logits[4, 1:] = float("-inf")
    logits[5] = float("-inf")
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[3] = 1 if vocab > 1 else 0
    target[6] = -100
    got_rows, lse = torch.ops.numba_hopper.cross_entropy_rows(logits, target, -100)
    d_rows = torch.randn(rows, device="cuda")
    got = torch.ops.numba_hopper.cross_entropy_grad(logits, target, -100, lse, d_rows)
    x = logits.double().requires_grad_()
    ref_rows = F.cross_entropy(x, target, reduction="none")
    ref_rows.backward(d_rows.double())
    finite = torch.isfinite(ref_rows)
    finite[5] = False
    assert torch.isnan(got_rows[5]) and torch.isnan(ref_rows[5])  # no finite logit: no loss
    assert rel_error(got_rows[finite], ref_rows[finite]) < 1e-5
    assert got.is_contiguous() and got.shape == logits.shape
    assert rel_error(got[finite], x.grad[finite]) < 1e-2  # the gradient rounded to bf16
    assert got[6].abs().max() == 0  # an ignored row
    if vocab > 1:
        assert got[3, ::3].abs().max() == 0  # masked columns


def test_leading_dimensions_and_the_current_stream():
    x, w, target = inputs(2 * 33, 5000, 128, torch.bfloat16)
    x3, t2 = x.detach().view(2, 33, 128), target.view(2, 33)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        got = nht.linear_cross_entropy(x3, w.detach(), t2, reduction="none")
    stream.synchronize()
    ref = F.cross_entropy(F.linear(x3, w.detach()).float().flatten(0, 1), t2.flatten(), reduction="none")
    assert got.shape == (2, 33) and rel_error(got.flatten(), ref) < 1e-5


def _qwen3(vocab=4096, tied=True):
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=vocab,
                                      use_cache=False, attn_implementation="sdpa", tie_word_embeddings=tied)
    torch.manual_seed(0)
    with torch.device("cuda"):
        return transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).train()


def test_fused_causal_lm_loss_matches_the_model_and_keeps_inference():
    linears = _qwen3()
    nht.replace_linear(linears)
    fused = nht.fuse_linear_cross_entropy(copy.deepcopy(linears))  # the loss is the only difference
    ids = torch.randint(0, 4096, (2, 129), device="cuda")
    labels = ids.clone()
    labels[0, :5] = -100
    out = {}
    for name, model in (("model", linears), ("fused", fused)):
        result = model(input_ids=ids, labels=labels)
        result.loss.backward()
        out[name] = (result, result.loss.detach(), model.lm_head.weight.grad,
                     model.model.layers[0].mlp.down_proj.weight.grad)
    assert out["fused"][0].logits is None and out["model"][0].logits is not None
    assert rel_error(out["fused"][1], out["model"][1]) < 1e-4
    for i in (2, 3):  # the tied head/embedding's gradient, and one inside the decoder
        assert rel_error(out["fused"][i], out["model"][i]) < 1e-2
    items = torch.tensor(100, device="cuda")
    with torch.no_grad():
        assert fused(input_ids=ids).logits.shape == (2, 129, 4096)  # no labels: the model's forward
        ref = linears(input_ids=ids, labels=labels, num_items_in_batch=items).loss
    got = fused(input_ids=ids, labels=labels, num_items_in_batch=items)
    assert got.logits is None and rel_error(got.loss.detach(), ref) < 1e-4


def test_compiled_fused_model_matches_the_compiled_model():
    linears = _qwen3()
    nht.replace_linear(linears)
    fused = nht.fuse_linear_cross_entropy(copy.deepcopy(linears))  # the loss is the only difference
    ids = torch.randint(0, 4096, (2, 64), device="cuda")
    out = {}
    for name, model in (("model", linears), ("fused", fused)):
        result = torch.compile(model, fullgraph=False)(input_ids=ids, labels=ids)
        result.loss.backward()
        out[name] = (result, result.loss.detach(), model.lm_head.weight.grad,
                     model.model.layers[1].mlp.up_proj.weight.grad)
    assert out["fused"][0].logits is None  # the fused loss was traced, not the model's
    assert rel_error(out["fused"][1], out["model"][1]) < 1e-4
    for i in (2, 3):
        assert rel_error(out["fused"][i], out["model"][i]) < 1e-2


@pytest.mark.parametrize("tied", [True, False])
def test_compiled_embedding_gradient_matches_float64(monkeypatch, tied):
    """Ours compiled (its embedding gradient one operator: ``_embedding_grad``) against the model in
    float64, as accurate as the stock model compiled; the stock graph keeps its own."""
    from numba_hopper.torch import _embedding_grad

    stock = _qwen3(tied=tied)
    ours, exact = copy.deepcopy(stock), copy.deepcopy(stock).double()
    nht.replace_linear(ours)
    nht.fuse_linear_cross_entropy(ours)
    calls, add_rows = [], _embedding_grad.add_embedding_rows
    monkeypatch.setattr(_embedding_grad, "add_embedding_rows", lambda *a: calls.append(1) or add_rows(*a))
    ids = torch.randint(0, 4096, (2, 64), device="cuda")
    ids[1, :40] = ids[0, :40]  # repeated ids
    grads = {}
    for name, model, run in (("exact", exact, exact), ("stock", stock, torch.compile(stock)),
                             ("ours", ours, torch.compile(ours))):
        run(input_ids=ids, labels=ids).loss.backward()
        grads[name] = model.model.embed_tokens.weight.grad
    assert len(calls) == 1, "ours' graph must hold the operator, and stock's must not"
    ours_error, stock_error = (rel_error(grads[n], grads["exact"]) for n in ("ours", "stock"))
    assert ours_error <= 1.25 * stock_error + 1e-3, (ours_error, stock_error)


def test_add_embedding_rows_never_waits_for_the_gpu():
    from numba_hopper.torch._embedding_grad import add_embedding_rows

    out = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 1000, (4, 300), device="cuda")
    values, mask = torch.randn(4, 300, 256, device="cuda"), ids % 7 != 0
    ref = add_embedding_rows(out.cpu(), ids.cpu(), values.cpu(), mask.cpu())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = add_embedding_rows(out.clone(), ids, values, mask)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert rel_error(got.cpu(), ref) < 1e-6


@pytest.mark.parametrize("n", [1, 7, 127, 129, 1000, 1025, 2048, 5000, 8192, 8193])
def test_lookups_sort_stably_by_id(n):
    """The lookups sorted in one CTA (``kernels.embedding_grad.sort_lookups_kernel``; past its capacity,
    ``torch.sort``) as ``torch.sort(stable=True)`` sorts them, ids outside the table as its
    row count (which the kernel that adds the rows skips)."""
    from numba_hopper.torch._embedding_grad import _sorted_lookups

    rows = 5000
    ids = torch.randint(-2, rows + 3, (n,), device="cuda")
    ids[: n // 2] = ids[0]  # a repeated id
    sorted_ids, order = _sorted_lookups(ids, rows)
    inside = torch.where((ids >= 0) & (ids < rows), ids, rows)
    want_ids, want_order = torch.sort(inside, stable=True)
    if n > 8192:  # (torch.sort keeps the ids outside the table as they are)
        want_ids, want_order = torch.sort(ids.to(torch.int32), stable=True)
    assert sorted_ids.dtype == torch.int32 and order.dtype == torch.int64
    assert torch.equal(sorted_ids.long(), want_ids.long()) and torch.equal(order, want_order)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [1, 7, 127, 129, 1000, 2560])
def test_add_embedding_rows_against_float64(dtype, width):
    """The kernel's table: each touched row the float32 sum of its lookups (repeated ids, one id
    looked up a hundred times, masked lookups) added to the row once, rounded once; every other
    row exactly as it was."""
    from numba_hopper.torch._embedding_grad import add_embedding_rows

    torch.manual_seed(width)
    vocab = 300
    out = torch.randn(vocab, width, device="cuda").to(dtype)
    ids = torch.randint(0, vocab, (3, 257), device="cuda")
    ids[2, :100] = 7  # one id looked up 100 times more
    values = torch.randn(3, 257, width, device="cuda")
    for mask in (None, ids % 5 != 0):
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask
        ref = out.double().index_add(0, ids[keep], values[keep].double())
        got = add_embedding_rows(out.clone(), ids, values, mask)
        touched = torch.zeros(vocab, dtype=torch.bool, device="cuda")
        touched[ids[keep]] = True
        assert torch.equal(got[~touched], out[~touched])
        assert rel_error(got, ref) < 4e-3  # one rounding to 16 bits
        assert rel_error(got[touched].double() - out[touched].double(),
                         ref[touched] - out[touched].double()) < 2e-2  # the sums themselves


def test_the_loss_never_waits_for_the_gpu():
    x, w, target = inputs(512, 32000, 256, torch.bfloat16)
    nht.linear_cross_entropy(x, w, target).backward()  # first call: compile and prepare
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # the GPU busy for ~0.1 s
    torch.cuda.set_sync_debug_mode("error")
    try:
        nht.linear_cross_entropy(x, w, target).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
