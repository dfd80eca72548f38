"""numba_hopper.torch.AdamW on a Hopper GPU: steps against a float64 AdamW and PyTorch's fused
AdamW at equal accuracy, ragged tensor sizes, groups, options, its state_dict, and no waiting.

    python -m pytest -q -n 0 tests/test_optim_gpu.py
"""

import copy

import pytest

torch = pytest.importorskip("torch")

import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.errors import DtypeError, LayoutError  # noqa: E402

pytestmark = pytest.mark.gpu

SIZES = [(1,), (7,), (127,), (129,), (1000,), (3, 4097), (8193,), (300, 1000)]  # tails, several chunks


def rel_error(got, ref):
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


def params(dtype, sizes=SIZES, seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, device="cuda").to(dtype)) for s in sizes]


def float64_adamw(ps, grads, steps, lr, betas, eps, weight_decay, maximize=False):
    """AdamW in float64 from the 16-bit starting values (the moments in float64 too)."""
    out = []
    for p, gs in zip(ps, grads):
        x = p.detach().double()
        m, v = torch.zeros_like(x), torch.zeros_like(x)
        for t in range(1, steps + 1):
            g = -gs[t - 1].double() if maximize else gs[t - 1].double()
            x = x - lr * weight_decay * x
            m = betas[0] * m + (1 - betas[0]) * g
            v = betas[1] * v + (1 - betas[1]) * g * g
            x = x - lr / (1 - betas[0] ** t) * m / (v.sqrt() / (1 - betas[1] ** t) ** 0.5 + eps)
        out.append(x)
    return out


def run(opt_cls, ps, grads, steps, **kw):
    opt = opt_cls(ps, **kw)
    for t in range(steps):
        for p, gs in zip(ps, grads):
            p.grad = gs[t].clone()
        opt.step()
    return opt


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("maximize", [False, True])
def test_steps_match_float64_as_closely_as_torch_fused(dtype, maximize):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, maximize=maximize)
    steps = 3
    ours, stock = params(dtype), params(dtype)
    grads = [[torch.randn_like(p) for _ in range(steps)] for p in ours]
    ref = float64_adamw(ours, grads, steps, **kw)
    run(nht.AdamW, ours, grads, steps, **kw)
    run(torch.optim.AdamW, stock, grads, steps, fused=True, **kw)
    for p, s, r in zip(ours, stock, ref):
        assert not torch.isnan(p).any()
        # the parameter's 16-bit rounding dominates both errors
        assert rel_error(p, r) <= 1.5 * rel_error(s, r) + 1e-6, (p.shape, rel_error(p, r), rel_error(s, r))
        assert rel_error(p, s) < 1e-2


def test_groups_options_and_missing_gradients():
    a, b, frozen = params(torch.bfloat16, [(4097,), (129,), (64,)])
    before = frozen.detach().clone()
    opt = nht.AdamW([{"params": [a]}, {"params": [b, frozen], "lr": 1e-1, "weight_decay": 0.0}], lr=1e-3)
    stock = torch.optim.AdamW([{"params": [p.detach().clone().requires_grad_() for p in (a,)]},
                               {"params": [b.detach().clone().requires_grad_()], "lr": 1e-1, "weight_decay": 0.0}],
                              lr=1e-3, fused=True)
    for t in range(2):
        g = [torch.randn_like(a), torch.randn_like(b)]
        a.grad, b.grad = g[0].clone(), g[1].clone()
        for p, gi in zip([q for group in stock.param_groups for q in group["params"]], g):
            p.grad = gi.clone()
        opt.step()
        stock.step()
    assert torch.equal(frozen, before) and frozen not in opt.state  # no gradient: not touched
    for p, s in zip((a, b), [q for group in stock.param_groups for q in group["params"]]):
        assert rel_error(p, s) < 1e-2
        assert opt.state[p]["step"].item() == 2


def test_state_dict_loads_into_torch_and_back():
    ours = params(torch.bfloat16, [(1000,), (7,)])
    opt = run(nht.AdamW, ours, [[torch.randn_like(p)] for p in ours], 1, lr=1e-2)
    stock_params = [p.detach().clone().requires_grad_() for p in ours]
    stock = torch.optim.AdamW(stock_params, lr=1e-2, fused=True)
    stock.load_state_dict(copy.deepcopy(opt.state_dict()))  # (as from a file: no shared tensors)
    again = nht.AdamW(ours, lr=1e-2)
    again.load_state_dict(copy.deepcopy(stock.state_dict()))  # fused AdamW's steps are CUDA tensors
    g = [torch.randn_like(p) for p in ours]
    for p, s, gi in zip(ours, stock_params, g):
        p.grad, s.grad = gi.clone(), gi.clone()
    again.step()
    stock.step()
    for p, s in zip(ours, stock_params):
        assert rel_error(p, s) < 1e-2 and again.state[p]["step"].item() == 2


def test_a_non_contiguous_gradient_is_copied():
    (p,) = params(torch.bfloat16, [(64, 96)])
    q = p.detach().clone().requires_grad_()
    g = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16)
    p.grad, q.grad = g.t(), g.t().contiguous()
    nht.AdamW([p], lr=1e-2).step()
    torch.optim.AdamW([q], lr=1e-2, fused=True).step()
    assert rel_error(p, q) < 1e-2


def test_unsupported_parameters_are_refused():
    (p,) = params(torch.bfloat16, [(64, 96)])
    with pytest.raises(LayoutError):
        nht.AdamW([torch.nn.Parameter(p.detach().t())])  # not contiguous
    with pytest.raises(LayoutError):
        nht.AdamW([torch.nn.Parameter(p.detach().view(-1)[1:])])  # starts 2 bytes in
    opt = nht.AdamW([p])
    with pytest.raises(DtypeError):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(4, device="cuda"))]})


def test_a_step_never_waits_for_the_gpu():
    ps = params(torch.bfloat16)
    opt = nht.AdamW(ps, lr=1e-3)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()  # first step: compile and prepare
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_steps_follow_changed_gradients_data_and_state():
    """A step reuses a group's launch only while it holds: a parameter that gains or loses its
    gradient, new parameter data and a loaded state_dict are taken up, as PyTorch's fused AdamW
    takes them, and the old data is not written."""
    ours = params(torch.bfloat16, [(1000,), (129,)])
    stock = [p.detach().clone().requires_grad_() for p in ours]
    opt, ref = nht.AdamW(ours, lr=1e-2), torch.optim.AdamW(stock, lr=1e-2, fused=True)

    def step(which):
        for i in which:
            g = torch.randn_like(ours[i])
            ours[i].grad, stock[i].grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for p in ours + stock:
            p.grad = None

    step([0, 1])
    step([0])
    step([0, 1])
    old = [p.data for p in ours]
    kept = [t.clone() for t in old]
    for p, s in zip(ours, stock):
        p.data, s.data = p.data.clone(), s.data.clone()
    step([0, 1])
    assert all(torch.equal(t, k) for t, k in zip(old, kept))
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    step([0, 1])
    for p, s in zip(ours, stock):
        assert rel_error(p, s) < 1e-2
    assert [opt.state[p]["step"].item() for p in ours] == [ref.state[s]["step"].item() for s in stock] == [5.0, 4.0]
