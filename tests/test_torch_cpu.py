"""numba_hopper.torch without a GPU: the custom ops' schemas and fake implementations, the
torch-semantics layer and the raw API on PyTorch's OpInfo samples, autograd, torch.compile /
torch.export tracing and Linear, all with a CPU stand-in for the GEMM (tests/_torch_double.py:
the real call path's checks and plans, the product in float64)."""

import copy
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nht = pytest.importorskip("numba_hopper.torch")

import _torch_cases as cases  # noqa: E402
import _torch_double  # noqa: E402

from numba_hopper import errors  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture
def double(monkeypatch):
    _torch_double.install(monkeypatch)


def test_import_numba_hopper_does_not_import_torch():
    code = "import sys, numba_hopper; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ops_schemas():
    assert str(torch.ops.numba_hopper.gemm.default._schema) == (
        "numba_hopper::gemm(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None, float alpha=1., "
        "float beta=0., int? bias_dim=None, str? activation=None, ScalarType? out_dtype=None) -> Tensor")
    assert str(torch.ops.numba_hopper.gemm_aux.default._schema).endswith("-> (Tensor, Tensor)")
    assert str(torch.ops.numba_hopper.bmm.default._schema) == (
        "numba_hopper::bmm(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opinfo_samples(double, dtype, requires_grad):
    pytest.importorskip("expecttest")
    cases.check_all_samples("cpu", dtype, requires_grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_opinfo_samples_through_the_raw_api(double, dtype):
    """mm, addmm, bmm and baddbmm's OpInfo samples through numba_hopper.gemm / bmm: the real
    checks and plans accept every one (K == 0 with an epilogue, bmm operands TMA cannot
    address, a broadcast c), none refused."""
    pytest.importorskip("expecttest")
    counts = cases.check_all_samples("cpu", dtype, False, raw=True)
    assert all(row["samples"] for row in counts.values()) and not any(row["refused"] for row in counts.values())


def _sample_ops():
    a, b = torch.randn(7, 24, dtype=torch.bfloat16), torch.randn(24, 9, dtype=torch.bfloat16)
    c, bias = torch.randn(7, 9, dtype=torch.bfloat16), torch.randn(9, dtype=torch.bfloat16)
    return [
        (torch.ops.numba_hopper.gemm.default, (a, b), {}),
        (torch.ops.numba_hopper.gemm.default, (a, b), {"c": c, "bias": bias, "alpha": 0.5, "beta": 2.0}),
        (torch.ops.numba_hopper.gemm_aux.default, (a, b), {"bias": bias, "activation": "silu"}),
        (torch.ops.numba_hopper.bmm.default, (torch.randn(3, 5, 10, dtype=torch.float16),
                                              torch.randn(3, 10, 6, dtype=torch.float16)), {}),
    ]


@pytest.mark.parametrize("case", range(4))
def test_opcheck(double, case):
    """torch.library.opcheck: schema, fake implementation, autograd registration, AOT dispatch."""
    op, args, kwargs = _sample_ops()[case]
    args = tuple(t.requires_grad_() for t in args)
    torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("shapes", [
    ((7,), (7,)), ((5, 7), (7,)), ((7,), (7, 3)), ((2, 5, 7), (7,)), ((2, 5, 7), (7, 3)), ((7,), (2, 7, 3)),
    ((2, 1, 5, 7), (3, 7, 4)), ((1, 5, 7), (4, 7, 2)), ((0, 5, 7), (7, 2)), ((5, 0), (0, 3)),
])
def test_matmul_shapes_match_torch(double, shapes):
    a, b = (torch.randn(*s, dtype=torch.bfloat16) for s in shapes)
    got, ref = nht.matmul(a, b), torch.matmul(a.double(), b.double())
    assert got.shape == ref.shape and got.dtype == torch.bfloat16
    assert cases.rel_error(got, ref) < 1e-2


@pytest.mark.parametrize("input_shape", [(), (1,), (9,), (1, 9), (7, 1), (7, 9)])
@pytest.mark.parametrize("k", [0, 16])
def test_addmm_broadcast_inputs(double, input_shape, k):
    m1, m2 = torch.randn(7, k, dtype=torch.bfloat16), torch.randn(k, 9, dtype=torch.bfloat16)
    inp = torch.randn(input_shape, dtype=torch.bfloat16)
    got = nht.addmm(inp, m1, m2, beta=0.5, alpha=2.0)
    ref = torch.addmm(inp.double(), m1.double(), m2.double(), beta=0.5, alpha=2.0)
    assert got.shape == ref.shape and cases.rel_error(got, ref) < 1e-2


def test_addmm_beta_zero_ignores_nan_input(double):
    m1, m2 = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 4, dtype=torch.bfloat16)
    got = nht.addmm(torch.full((4, 4), float("nan"), dtype=torch.bfloat16), m1, m2, beta=0)
    assert not got.isnan().any()


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid"])
def test_linear_gradients_match_float64(double, activation):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 40, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(24, 40, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(24, dtype=torch.bfloat16, requires_grad=True)
    y = nht.linear(x, w, b, activation=activation)
    act = _torch_double._ACT[activation]
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = act(torch.nn.functional.linear(*ref_leaves))
    grad_out = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), grad_out)
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out.double())
    assert cases.rel_error(y, ref) < 1e-2
    for g, r, t in zip(grads, ref_grads, (x, w, b)):
        assert g.shape == t.shape and g.dtype == t.dtype and g.is_contiguous()
        assert cases.rel_error(g, r) < 2e-2


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_double_backward_matches_float64(double, activation):
    """create_graph=True (a gradient penalty): the eager linear's backward is differentiable."""
    torch.manual_seed(0)
    leaves = [torch.randn(*s, dtype=torch.bfloat16, requires_grad=True) for s in ((2, 5, 16), (12, 16), (12,))]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    grad_out = torch.randn(2, 5, 12, dtype=torch.bfloat16)
    act = _torch_double._ACT[activation]
    penalties = []
    for (x, w, b), f in ((leaves, lambda *t: nht.linear(*t, activation=activation)),
                         (ref_leaves, lambda *t: act(torch.nn.functional.linear(*t)))):
        (dx,) = torch.autograd.grad(f(x, w, b), x, grad_out.to(x.dtype), create_graph=True)
        penalties.append(torch.autograd.grad(dx.square().sum(), (w, b), allow_unused=True))
    for got, ref in zip(*penalties):
        if ref is None:  # without an activation dx does not depend on the bias
            assert got is None or not got.any()
        else:
            assert cases.rel_error(got, ref) < 3e-2


def test_eager_linear_is_one_autograd_node(double):
    """Eager training calls numba_hopper.gemm from one autograd Function: no reshape, transpose
    or operator nodes of its own (their host time is what the training step measured)."""
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    y = nht.linear(x, w)
    assert type(y.grad_fn).__name__ == "_LinearFunctionBackward"
    assert [type(f).__name__ for f, _ in y.grad_fn.next_functions[:2]] == ["AccumulateGrad"] * 2


def test_gemm_with_activation_refuses_backward(double):
    a = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="gemm_aux"):
        torch.ops.numba_hopper.gemm(a, torch.randn(8, 4, dtype=torch.bfloat16), activation="relu")


def test_linear_module_is_a_drop_in():
    stock = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
    state = copy.deepcopy(stock.state_dict())
    params = [id(p) for p in stock.parameters()]
    assert nht.replace_linear(stock) == 2 and nht.replace_linear(stock) == 0
    assert all(isinstance(stock[i], nht.Linear) for i in (0, 2))
    assert [id(p) for p in stock.parameters()] == params
    assert stock.state_dict().keys() == state.keys()
    fresh = nht.Linear(16, 32)
    fresh.load_state_dict({"weight": state["0.weight"], "bias": state["0.bias"]})
    assert torch.equal(fresh.weight, stock[0].weight)


def test_compile_fullgraph_and_gradients(double):
    """torch.compile(fullgraph=True) traces the model (aot_eager: AOTAutograd, no codegen)."""
    stock, ours = cases.models("cpu", torch.bfloat16)
    x = torch.randn(2, 33, 64, dtype=torch.bfloat16)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    got = compiled(x)
    ref = ours(x)
    assert cases.rel_error(got, ref) < 1e-2 and cases.rel_error(got, stock(x)) < 2e-2
    got.float().square().sum().backward()
    assert all(p.grad is not None for p in ours.parameters())


def test_no_grad_ops_pass_opcheck(double):
    a, b = torch.randn(7, 24, dtype=torch.bfloat16), torch.randn(24, 9, dtype=torch.bfloat16)
    bias = torch.randn(9, dtype=torch.bfloat16)
    # (schemas without defaults: the traced call passes every argument, by position)
    torch.library.opcheck(torch.ops.numba_hopper.gemm_no_grad.default, (a, b, None, bias, 0.5, 0.0, 1, "relu", None))
    for sustained in (False, True):
        torch.library.opcheck(torch.ops.numba_hopper.mm.default, (a, b, sustained))
    torch.library.opcheck(torch.ops.numba_hopper.bmm_no_grad.default,
                          (torch.randn(3, 5, 10, dtype=torch.float16), torch.randn(3, 10, 6, dtype=torch.float16), None))


def test_embedding_grad_ops_pass_opcheck(double):
    ids = torch.tensor([[3, 1, 3], [0, 4, 1]])
    values, mask = torch.randn(2, 3, 8), (ids != 4)[..., None]
    for m in (None, mask):
        torch.library.opcheck(torch.ops.numba_hopper.embedding_grad.default, (ids, values, m, 6, torch.bfloat16))
    a, b = torch.randn(6, 24, dtype=torch.bfloat16), torch.randn(24, 8, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.numba_hopper.mm_embedding_grad.default, (a, b, True, ids, values, mask))


def test_a_graph_traced_without_grad_calls_the_operators_without_a_formula(double):
    """Under torch.no_grad() the traced graph holds ``gemm_no_grad`` (no autograd layer to run in
    Python per call), ``mm`` for the linear without bias; with grad, ``gemm``, whose
    formula the backward needs."""
    _, ours = cases.models("cpu", torch.bfloat16)
    x = torch.randn(2, 33, 64, dtype=torch.bfloat16)
    graphs = []

    def record(gm, inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    compiled = torch.compile(ours, fullgraph=True, backend=record)
    with torch.no_grad():
        got = compiled(x)
        assert cases.rel_error(got, ours(x)) < 1e-2
    compiled(x)
    without, with_grad = graphs
    assert {"numba_hopper.gemm_no_grad.default", "numba_hopper.mm.default",
            "numba_hopper.bmm_no_grad.default"} <= without, without
    assert not any(t in without for t in ("numba_hopper.gemm.default", "numba_hopper.bmm.default"))
    assert {"numba_hopper.gemm.default", "numba_hopper.bmm.default"} <= with_grad, with_grad
    assert not any("no_grad" in t or t == "numba_hopper.mm.default" for t in with_grad)


def test_inductor_calls_numba_hopper_gemm_directly_for_mm(double):
    """Inductor lowers ``mm`` to ``numba_hopper.gemm(a, b, out=buf)`` called from its
    wrapper (``_lowering``), not the operator through the dispatcher."""
    from torch._inductor.utils import run_and_get_code

    x, w = torch.randn(33, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    compiled = torch.compile(lambda x, w: torch.ops.numba_hopper.mm.default(x, w.t(), False), fullgraph=True)
    got, (code, *_) = run_and_get_code(compiled, x, w)
    assert "extern_kernels.numba_hopper_mm(" in code and "torch.ops.numba_hopper" not in code, code
    assert cases.rel_error(got, x.double() @ w.double().t()) < 1e-2


def test_inductor_calls_numba_hopper_gemm_directly_in_training(double):
    """A compiled training step's plain products (the forward's linears, the backward's dX and dW,
    traced as ``numba_hopper::gemm``) are called directly, as ``mm``'s are (``_lowering``), in the
    training tiles (``sustained``); a linear with a bias keeps the operator."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.GELU(),
                              torch.nn.Linear(96, 48)).to(torch.bfloat16)
    nht.replace_linear(mlp)
    x = torch.randn(33, 64, dtype=torch.bfloat16, requires_grad=True)
    ref = mlp(x).float().square().sum()
    ref.backward()
    ref_grads = [t.grad.clone() for t in (x, mlp[0].weight, mlp[2].weight)]
    for t in (x, *mlp.parameters()):
        t.grad = None

    def step():
        loss = torch.compile(mlp, fullgraph=True)(x).float().square().sum()
        loss.backward()
        return loss

    loss, codes = run_and_get_code(step)
    forward, backward = codes
    # forward: the first linear (the second has a bias); backward: dX and dW of both
    assert forward.count("extern_kernels.numba_hopper_mm(") == forward.count("sustained=True") == 1, forward
    assert backward.count("extern_kernels.numba_hopper_mm(") == backward.count("sustained=True") == 4, backward
    assert forward.count("torch.ops.numba_hopper.gemm.default(") == 1, forward
    assert "torch.ops.numba_hopper.gemm.default(" not in backward, backward
    assert cases.rel_error(loss, ref) < 1e-2
    for t, want in zip((x, mlp[0].weight, mlp[2].weight), ref_grads):
        assert cases.rel_error(t.grad, want) < 2e-2


class _TinyLM(torch.nn.Module):
    """An embedding, a linear and an output layer, tied to the embedding or not."""

    def __init__(self, tied, vocab=50, hidden=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, padding_idx=3)
        self.proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.proj(self.embed(ids))))


@pytest.mark.parametrize("tied", [True, False])
def test_compiled_embedding_gradient_without_a_float32_table(double, tied):
    """A compiled training graph's embedding gradient is one operator (``_embedding_grad``): for a
    weight tied to the output layer, that layer's product with the looked-up rows added; else a
    table of the weight's dtype. Repeated ids and the padding id's lookups as the decomposition has
    them, against float64."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    ref_model = _TinyLM(tied).double()
    model = copy.deepcopy(ref_model).to(torch.bfloat16)
    nht.replace_linear(model)
    ids = torch.randint(0, 50, (2, 33))
    ids[0, :4] = 3  # the padding id: no gradient from its lookups
    ref_model(ids).square().mean().backward()

    def step():
        loss = torch.compile(model, fullgraph=True)(ids).float().square().mean()
        loss.backward()

    _, (_, backward) = run_and_get_code(step)
    op = "mm_embedding_grad" if tied else "embedding_grad"
    assert backward.count(f"torch.ops.numba_hopper.{op}.default(") == 1, backward
    assert "index_put" not in backward and "masked_index_put" not in backward, backward
    assert cases.rel_error(model.embed.weight.grad, ref_model.embed.weight.grad) < 1e-2


def test_add_embedding_rows_rounds_each_row_once():
    from numba_hopper.torch._embedding_grad import add_embedding_rows

    torch.manual_seed(0)
    out = torch.randn(20, 16, dtype=torch.bfloat16)
    ids = torch.tensor([[3, 7, 3, 0], [19, 3, 7, 5]])
    values = torch.randn(2, 4, 16)
    mask = ids != 5
    ref = out.double()
    for i, row, keep in zip(ids.flatten(), values.reshape(8, 16), mask.flatten()):
        ref[i] += row.double() * keep
    got = add_embedding_rows(out.clone(), ids, values, mask[..., None])
    assert torch.equal(got, ref.to(torch.bfloat16))  # float32 sums of a few rows: the same rounding
    assert torch.equal(got[5], out[5]) and torch.equal(got[1], out[1])
    assert torch.equal(add_embedding_rows(out.clone(), ids, values), (out.double() + torch.zeros_like(ref).index_add_(
        0, ids.flatten(), values.reshape(8, 16).double())).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_add_rows_kernel_compiles_without_spills(dtype):
    from numba_hopper.kernels.embedding_grad import COLUMNS, add_rows_kernel
    from numba_hopper.tools.sass import inspect_kernel

    r = inspect_kernel(add_rows_kernel(dtype), "void(int64, int64, int64, int32[::1], int64[::1], float32[:, ::1])")
    assert r.spill_bytes == 0 and r.stack_frame == 0 and "CALL" not in r.sass, r.summary()  # sums in registers
    assert r.count("FADD") >= COLUMNS and r.count("LDG.E.U16") == COLUMNS and r.count("STG.E.U16") == COLUMNS, \
        r.summary()


@pytest.mark.parametrize("slots", [1, 8])
def test_sort_lookups_keeps_its_keys_in_registers_without_spills(slots):
    """A thread's keys stay in registers: exchanged within a warp by shuffles, across warps
    through shared memory."""
    from numba_hopper.kernels.embedding_grad import sort_lookups_kernel
    from numba_hopper.tools.sass import inspect_kernel

    r = inspect_kernel(sort_lookups_kernel(slots), "void(int64[::1], int64, int64, int32[::1], int64[::1])")
    assert r.spill_bytes == 0 and r.stack_frame == 0 and "CALL" not in r.sass, r.summary()
    assert r.count("SHFL.BFLY") >= slots and r.count("LDS") and r.count("STS") and r.count("BAR.SYNC"), r.summary()
    assert not r.count("LDL") and not r.count("STL"), r.summary()


@pytest.mark.long
@pytest.mark.parametrize("training_config", ["sustained", None])
def test_eager_training_products_take_the_training_tiles(double, monkeypatch, training_config):
    """With a gradient, a linear's forward and its gradients' products are planned with
    ``training.GEMM_CONFIG`` (a 4096 x 8448 forward: 2x1 clusters where "sustained"); without, the
    burst-tuned default."""
    from numba_hopper.matmul.plan import _Gemm
    from numba_hopper.torch import training

    monkeypatch.setattr(training, "GEMM_CONFIG", training_config)
    linear = nht.Linear(64, 8448, bias=False, dtype=torch.bfloat16)
    x = torch.randn(4096, 64, dtype=torch.bfloat16)

    def clusters():
        (gemm,) = [s for s in _torch_double.PLANS[-1].specs if isinstance(s, _Gemm)]
        return gemm.cfg.cluster_m

    with torch.no_grad():
        linear(x)
    assert clusters() == 1
    linear(x.requires_grad_())
    assert clusters() == (2 if training_config else 1)


def test_inductor_cpp_wrapper_keeps_the_mm_operator(double):
    """A C++ wrapper (AOTInductor's) cannot call Python: the lowering leaves it the operator."""
    from torch._inductor.utils import run_and_get_code

    x, w = torch.randn(33, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    with torch._inductor.config.patch(cpp_wrapper=True):
        compiled = torch.compile(lambda x, w: torch.ops.numba_hopper.mm.default(x, w.t(), False), fullgraph=True)
        got, codes = run_and_get_code(compiled, x, w)
    assert any('"numba_hopper::mm"' in c for c in codes) and not any("numba_hopper_mm(" in c for c in codes)
    assert cases.rel_error(got, x.double() @ w.double().t()) < 1e-2


def test_export_graph_holds_the_custom_ops(double):
    _, ours = cases.models("cpu", torch.bfloat16)
    exported = torch.export.export(ours, (torch.randn(2, 33, 64, dtype=torch.bfloat16),), strict=True)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"numba_hopper.gemm.default", "numba_hopper.bmm.default"} <= targets, targets
    assert not any("aten.mm" in t or "aten.bmm" in t or "aten.addmm" in t for t in targets), targets


def test_training_follows_nn_linear(double):
    stock, ours = cases.models("cpu", torch.bfloat16)
    ref = cases.training_losses(stock, "cpu", torch.bfloat16)
    got = cases.training_losses(ours, "cpu", torch.bfloat16)
    assert got[-1] < 0.5 * got[0]
    assert max(abs(g - r) / r for g, r in zip(got, ref)) < 0.05


def test_bad_input_raises_before_launch(double):
    with pytest.raises(errors.DtypeError):
        nht.mm(torch.randn(4, 8), torch.randn(8, 4))
    with pytest.raises(RuntimeError, match="2-D"):
        nht.mm(torch.randn(2, 4, 8, dtype=torch.bfloat16), torch.randn(8, 4, dtype=torch.bfloat16))
    with pytest.raises(errors.ShapeError):
        torch.ops.numba_hopper.bmm(torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 4, dtype=torch.bfloat16))


class _SwiGLU(torch.nn.Module):
    """A Llama MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden=64, inner=96):
        super().__init__()
        self.gate_proj, self.up_proj = (torch.nn.Linear(hidden, inner, bias=False) for _ in range(2))
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Attention(torch.nn.Module):
    """An attention block's projections and a gated MLP on one normalized input each: the
    backward sums three products (query, key, value) and two (gate, up)."""

    def __init__(self, hidden=64, kv=32, inner=96):
        super().__init__()
        self.q_proj, self.o_proj = torch.nn.Linear(hidden, hidden, bias=False), torch.nn.Linear(hidden, hidden, bias=False)
        self.k_proj, self.v_proj = (torch.nn.Linear(hidden, kv, bias=False) for _ in range(2))
        self.mlp = _SwiGLU(hidden, inner)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = x + self.o_proj(q * torch.cat((k, v), dim=-1).sigmoid())
        return h + self.mlp(torch.nn.functional.rms_norm(h, (h.shape[-1],)))


def test_pass_sums_the_products_of_an_input_gradient(double):
    """A compiled training graph's input gradient through several linears is one ``gemm_sum`` each
    (``_post_grad.sum_products``): three products for q, k and v, two for gate and up; outputs
    and gradients against float64."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    ref_model = _Attention().double()
    model = copy.deepcopy(ref_model).to(torch.bfloat16)
    nht.replace_linear(model)
    x = torch.randn(2, 9, 64)
    x_ref, x_in = x.double().requires_grad_(), x.to(torch.bfloat16).requires_grad_()
    ref = ref_model(x_ref)
    ref.square().mean().backward()

    def step():
        got = torch.compile(model, fullgraph=True)(x_in)
        got.float().square().mean().backward()
        return got

    with torch._inductor.config.patch(force_disable_caches=True):  # (a cached graph runs no pass)
        got, (_, backward) = run_and_get_code(step)
    assert backward.count("extern_kernels.numba_hopper_mm_sum(") == 2, backward
    assert sorted(len(p.specs[-1].segments) + 1 for p in _torch_double.PLANS if _segmented(p)) == [2, 3]
    assert cases.rel_error(got, ref) < 2e-2 and cases.rel_error(x_in.grad, x_ref.grad) < 3e-2
    for p, ref_p in zip(model.parameters(), ref_model.parameters()):
        assert cases.rel_error(p.grad, ref_p.grad) < 3e-2


def test_pass_sums_the_products_of_an_inference_graph(double):
    """Under torch.no_grad() a sum of two linears' outputs is one ``gemm_sum`` too."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    ref_model = _Attention().double()
    model = copy.deepcopy(ref_model).to(torch.bfloat16)
    nht.replace_linear(model)
    x = torch.randn(2, 9, 64)

    def both(x):
        return model.k_proj(x) + model.v_proj(x.flip(-1))

    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        got, (code,) = run_and_get_code(torch.compile(both, fullgraph=True), x.to(torch.bfloat16))
        ref = ref_model.k_proj(x.double()) + ref_model.v_proj(x.double().flip(-1))
    assert code.count("extern_kernels.numba_hopper_mm_sum(") == 1, code
    assert cases.rel_error(got, ref) < 1e-2


def _segmented(plan):
    return plan.specs and getattr(plan.specs[-1], "segments", ())


def test_sum_pass_leaves_sums_it_cannot_run_as_one():
    """A product used elsewhere, or products in different tilings, stay products and adds."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from numba_hopper.torch import _post_grad

    mm = torch.ops.numba_hopper.mm.default

    def f(a, b, c, w):
        kept = mm(a, w, True)
        return kept + mm(b, w, True), kept, mm(c, w, True) + mm(b, w, False)

    args = (torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16),
            torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(16, 16, dtype=torch.bfloat16))
    with torch._subclasses.FakeTensorMode():
        graph = make_fx(f, tracing_mode="fake")(*args).graph
    assert _post_grad.sum_products(graph) == 0


class _GatedMLP(torch.nn.Module):
    def __init__(self, hidden=64, inner=128, act=torch.nn.functional.silu):
        super().__init__()
        self.act = act
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("act,fused", [(torch.nn.functional.silu, 1), (torch.nn.functional.gelu, 0)])
def test_pass_fuses_a_training_swiglu_both_ways(double, act, fused):
    """A compiled training graph's gate and up products and the SiLU-and-multiply are one gated GEMM
    that keeps both products for the backward (``gated_mm_products``), and its ``dy @ W_down`` and
    the derivative that reads it one ``gemm_glu_backward``, reading those products' halves
    (``_post_grad.glu_backwards``, which recognizes the derivative by its values: a GELU's is left
    alone); gradients against float64."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    ref_model = _GatedMLP(act=act).double()
    model = copy.deepcopy(ref_model).to(torch.bfloat16)
    nht.replace_linear(model)
    x = torch.randn(2, 9, 64)
    x_ref, x_in = x.double().requires_grad_(), x.to(torch.bfloat16).requires_grad_()
    ref_model(x_ref).square().mean().backward()

    def step():
        torch.compile(model, fullgraph=True)(x_in).float().square().mean().backward()

    with torch._inductor.config.patch(force_disable_caches=True):  # (a cached graph runs no pass)
        _, (forward, backward) = run_and_get_code(step)
    assert forward.count("torch.ops.numba_hopper.gated_mm_products.default(") == fused, forward
    assert backward.count("torch.ops.numba_hopper.mm_glu_backward.default(") == fused, backward
    assert cases.rel_error(x_in.grad, x_ref.grad) < 3e-2
    for p, ref_p in zip(model.parameters(), ref_model.parameters()):
        assert cases.rel_error(p.grad, ref_p.grad) < 3e-2


def test_mm_glu_backward_passes_opcheck(double):
    a, b = torch.randn(7, 24, dtype=torch.bfloat16), torch.randn(24, 16, dtype=torch.bfloat16)
    gate, up = torch.randn(7, 16, dtype=torch.bfloat16), torch.randn(7, 16, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.numba_hopper.mm_glu_backward.default, (a, b, gate, up, True))


def test_mm_sum_passes_opcheck(double):
    a = [torch.randn(7, k, dtype=torch.bfloat16) for k in (24, 8)]
    b = [torch.randn(k, 9, dtype=torch.bfloat16) for k in (24, 8)]
    torch.library.opcheck(torch.ops.numba_hopper.mm_sum.default, (a, b, True))


def test_inductor_cache_keys_graphs_by_the_files_their_code_calls(monkeypatch):
    """A graph compiled through the post-grad pass is cached under a key of the pass's ``uuid``,
    which hashes every file whose functions the graph's code calls or whose operators it holds
    (the lowering's direct calls included): a cached graph of another version is not reused."""
    from numba_hopper.torch import _embedding_grad, _lowering, _post_grad, ops

    hashed = []
    monkeypatch.setattr(_post_grad, "get_hash_for_files", lambda files: hashed.extend(files) or "hash")
    assert _post_grad.PostGradPass().uuid()[0] == "hash"
    assert set(hashed) == {m.__file__ for m in (_post_grad, ops, _embedding_grad, _lowering)}, hashed


class _Rotary(torch.nn.Module):
    """A query and a key projection with rotary position embeddings, as a transformers attention
    layer applies them: one table of cosines and one of sines, each read once per head."""

    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.k_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))

    def forward(self, x):
        b, s, _ = x.shape
        freqs = torch.arange(s, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)

        def rotate(t):
            t = t.view(b, s, self.heads, self.dim).transpose(1, 2)
            half = self.dim // 2
            return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

        return rotate(self.q_proj(x)) * rotate(self.k_proj(x))


def test_pass_holds_broadcast_sines_and_cosines_in_memory(double, monkeypatch):
    """A compiled training graph's rotary tables, which each head reads, are held in memory, once
    in the forward and once in the backward (``_post_grad.materialize_broadcast_trig``); outputs and
    gradients against float64."""
    from torch._inductor.utils import run_and_get_code

    from numba_hopper.torch import _post_grad

    held = []
    count = _post_grad.materialize_broadcast_trig
    monkeypatch.setattr(_post_grad, "materialize_broadcast_trig", lambda graph: held.append(count(graph)) or held[-1])
    torch.manual_seed(0)
    ref_model = _Rotary().double()
    model = copy.deepcopy(ref_model).to(torch.bfloat16)
    nht.replace_linear(model)
    x = torch.randn(2, 9, 64)
    ref = ref_model(x.double())
    ref.square().mean().backward()

    def step():
        got = torch.compile(model, fullgraph=True)(x.to(torch.bfloat16))
        got.float().square().mean().backward()
        return got

    with torch._inductor.config.patch(force_disable_caches=True):  # (a cached graph runs no pass)
        got, codes = run_and_get_code(step)
    assert held == [2, 2]  # the forward's cosine and sine, then the backward's
    # each computed once a graph (inlined, the backward computed the sine in each of its readers)
    assert [(code.count("cos("), code.count("sin(")) for code in codes] == [(1, 1), (1, 1)], codes
    assert cases.rel_error(got, ref) < 2e-2
    for p, ref_p in zip(model.parameters(), ref_model.parameters()):
        assert cases.rel_error(p.grad, ref_p.grad) < 3e-2


def test_broadcast_trig_pass_keeps_the_scaling_and_leaves_elementwise_uses():
    """The table held is the value after its scaling and conversion; a sine read element by element
    stays inlined (holding it would add a pass over memory)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from numba_hopper.torch import _post_grad

    def f(freqs, q, x):  # (the cast as post-grad graphs have it)
        return q * torch.ops.prims.convert_element_type(freqs.cos() * 2.0, torch.bfloat16), x.sin() * x

    graph = make_fx(f, tracing_mode="fake")(torch.randn(8, 4), torch.randn(3, 8, 4, dtype=torch.bfloat16),
                                            torch.randn(8, 4)).graph
    assert _post_grad.materialize_broadcast_trig(graph) == 1
    (kept,) = (n for n in graph.nodes if n.target is torch.ops.numba_hopper.materialized.default)
    assert kept.args[0].target is torch.ops.prims.convert_element_type.default
    assert [u.target for u in kept.users] == [torch.ops.aten.mul.Tensor]
    torch.library.opcheck(torch.ops.numba_hopper.materialized.default, (torch.randn(8, 4),))


@pytest.mark.parametrize("dynamic", [False, True])
def test_inductor_fuses_a_gated_mlp_into_one_gemm(double, dynamic):
    """Under torch.no_grad() Inductor's post-grad pass (``_post_grad``) puts one gated GEMM in place of
    the gate and up products and the SiLU-and-multiply between them (static or symbolic rows)."""
    from torch._inductor.utils import run_and_get_code

    mlp = _SwiGLU().to(torch.bfloat16)
    x = torch.randn(2, 33, 64, dtype=torch.bfloat16)
    ref = mlp.double()(x.double())
    nht.replace_linear(mlp.to(torch.bfloat16))
    with torch.no_grad():
        got, (code, *_) = run_and_get_code(torch.compile(mlp, fullgraph=True, dynamic=dynamic), x)
    assert code.count("extern_kernels.numba_hopper_gated_mm(") == 1, code
    assert code.count("extern_kernels.numba_hopper_mm(") == 1, code  # the down projection
    assert cases.rel_error(got, ref) < 1e-2


@pytest.mark.long
def test_gated_pass_keeps_products_used_elsewhere(double):
    """A product that something else also reads (here the gate's, returned) is kept: the gated GEMM
    writes both products too (``gated_mm_products``), and the reader gets its slice."""
    from torch._inductor.utils import run_and_get_code

    mlp = _SwiGLU().to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    ref = mlp.double()(x.double())
    ref_g = x.double() @ mlp.gate_proj.weight.t()
    nht.replace_linear(mlp.to(torch.bfloat16))

    def both(x):
        g = mlp.gate_proj(x)
        return mlp.down_proj(torch.nn.functional.silu(g) * mlp.up_proj(x)), g

    with torch.no_grad():
        (out, g), (code, *_) = run_and_get_code(torch.compile(both, fullgraph=True), x)
    assert code.count("torch.ops.numba_hopper.gated_mm_products.default(") == 1, code
    assert code.count("extern_kernels.numba_hopper_mm(") == 1, code  # the down projection
    assert cases.rel_error(out, ref) < 1e-2 and cases.rel_error(g, ref_g) < 1e-2


@pytest.mark.parametrize("op", ["gated_mm", "gated_mm_products"])
def test_gated_mm_passes_opcheck(double, op):
    a = torch.randn(7, 24, dtype=torch.bfloat16)
    b, up = (torch.randn(9, 24, dtype=torch.bfloat16).t() for _ in range(2))
    torch.library.opcheck(getattr(torch.ops.numba_hopper, op).default, (a, b, up, "silu"))


def test_fused_gated_mlp_keeps_the_module_and_its_answers(double, monkeypatch):
    """``fuse_gated_mlps``: the same parameters and state_dict; in inference one gated product
    (eager and traced), with a gradient the three linears (whose backward needs both products)."""
    model = torch.nn.Sequential(_SwiGLU().to(torch.bfloat16))
    model[0].act_fn = torch.nn.SiLU()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 33, 64, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(
        torch.nn.functional.silu(x.double() @ state["0.gate_proj.weight"].double().t())
        * (x.double() @ state["0.up_proj.weight"].double().t()), state["0.down_proj.weight"].double())
    assert nht.fuse_gated_mlps(model) == 1 and nht.fuse_gated_mlps(model) == 0
    assert isinstance(model[0], nht.GatedMLP) and isinstance(model[0].gate_proj, nht.Linear)
    assert model.state_dict().keys() == state.keys()
    from numba_hopper.matmul import api

    calls, gemm = [], api.gemm
    monkeypatch.setattr(api, "gemm", lambda *a, **kw: calls.append(kw.get("up") is not None)
                        or gemm(*a, **kw))
    with torch.no_grad():
        got = model(x)
    assert calls == [True, False] and cases.rel_error(got, ref) < 1e-2
    graphs = []

    def record(gm, inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    with torch.no_grad():
        assert cases.rel_error(torch.compile(model, fullgraph=True, backend=record)(x), ref) < 1e-2
    assert "numba_hopper.gated_mm.default" in graphs[0], graphs
    calls.clear()
    x.requires_grad_(True)
    model(x).float().square().sum().backward()  # training: the three linears
    assert calls == [False] * 9 and x.grad is not None and model[0].gate_proj.weight.grad is not None
    model[0].fused_training = True
    calls.clear()
    model(x).float().square().sum().backward()  # the operator gated_mlp, forward and backward
    assert calls == [True] + [False] * 6  # (and dy @ W_down through gemm_glu_backward)


@pytest.mark.parametrize("shape,bias", [((1, 64), False), ((2, 33, 64), True), ((129, 64), False)])
def test_gated_mlp_training_matches_float64(double, shape, bias):
    errors = cases.gated_mlp_errors("cpu", torch.bfloat16, shape, bias=bias)
    assert max(errors.values()) < 1e-2, errors


def test_fused_gated_mlp_double_backward_matches_float64(double):
    """create_graph=True through the fused training MLP: its backward is differentiable."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(cases.SwiGLU(16, 24, "cpu", torch.bfloat16, bias=True))
    ref = copy.deepcopy(model).double()
    nht.fuse_gated_mlps(model, fused_training=True)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16, requires_grad=True)
    xr = x.detach().double().requires_grad_()
    grad_out = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    penalties = []
    for m, xx in ((model, x), (ref, xr)):
        (dx,) = torch.autograd.grad(m(xx), xx, grad_out.to(xx.dtype), create_graph=True)
        penalties.append(torch.autograd.grad(dx.square().sum(), [p for _, p in m.named_parameters()],
                                             allow_unused=True))
    for got, r in zip(*penalties):
        if r is None:  # dx does not depend on down's bias
            assert got is None or not got.any()
        else:
            assert cases.rel_error(got, r) < 3e-2


def test_compiled_gated_mlp_training_is_one_operator_each_way(double):
    """Traced with a gradient, the fused MLP is ``numba_hopper::gated_mlp`` and its backward
    ``numba_hopper::gated_mlp_backward``: nothing between the products for Inductor to fuse."""
    from torch._inductor.utils import run_and_get_code

    model = torch.nn.Sequential(cases.SwiGLU(64, 96, "cpu", torch.bfloat16))
    nht.fuse_gated_mlps(model, fused_training=True)
    x = torch.randn(2, 33, 64, dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):  # (a cached backward shows no code)
        y, (forward_code, *_) = run_and_get_code(compiled, x)
        _, (backward_code, *_) = run_and_get_code(lambda: y.float().square().sum().backward())
    assert "torch.ops.numba_hopper.gated_mlp.default(" in forward_code, forward_code
    assert "torch.ops.numba_hopper.gated_mlp_backward.default(" in backward_code, backward_code
    assert max(cases.gated_mlp_errors("cpu", torch.bfloat16, (2, 33, 64), compiled=True).values()) < 1e-2
