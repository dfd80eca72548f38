"""numba_hopper.torch.AdamW without a GPU: its kernel's SASS (16-byte accesses, no spills) and
the checks that run before any update.

    python -m pytest -q -n 0 tests/test_optim_cpu.py
"""

import pytest

from numba_hopper.kernels.adamw import adamw_kernel
from numba_hopper.tools.sass import inspect_kernel

SIG = "void(int64[:, ::1], float32, float32, float32, float32, float32)"


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_kernel_moves_16_bytes_an_access_without_spills(dtype):
    r = inspect_kernel(adamw_kernel(dtype), SIG)
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    # parameter, first and second moment read and written 16 bytes at a time, the gradient read:
    # a thread's two vectors, then a tensor's end one vector at a time
    assert r.count("LDG.E.128") == 9 and r.count("LDG.E.NA.128.CONSTANT") == 3, r.summary()
    assert r.count("STG.E.128") == 9, r.summary()
    accesses = [line.split()[1] for line in r.sass.splitlines() if ".128" in line and ("LDG" in line or "STG" in line)]
    assert "STG" not in " ".join(accesses[:8]), accesses  # both vectors loaded before either is stored
    assert r.count("LDG.E.U16.CONSTANT") >= 1 and r.count("STG.E.U16") >= 3  # a tensor's last elements


torch = pytest.importorskip("torch")

import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.errors import DeviceMismatchError, DtypeError  # noqa: E402


@pytest.mark.parametrize("param, kwargs, error", [
    (torch.zeros(4, dtype=torch.float32), {}, DtypeError),
    (torch.zeros(4, dtype=torch.bfloat16), {}, DeviceMismatchError),
    (torch.zeros(4, dtype=torch.bfloat16), {"amsgrad": True}, ValueError),
    (torch.zeros(4, dtype=torch.bfloat16), {"lr": torch.tensor(1e-3)}, ValueError),
    (torch.zeros(4, dtype=torch.bfloat16), {"betas": (1.0, 0.999)}, ValueError),
    (torch.zeros(4, dtype=torch.bfloat16), {"weight_decay": -1.0}, ValueError),
], ids=["f32", "cpu", "amsgrad", "tensor-lr", "beta", "weight-decay"])
def test_unsupported_parameters_and_options_are_refused(param, kwargs, error):
    with pytest.raises(error):
        nht.AdamW([torch.nn.Parameter(param)], **kwargs)


def test_the_step_table():
    """A launch's table: each tensor's addresses, size and first chunk, fixed between steps; each
    step's gradient addresses, with gradients that the kernel cannot read as they are (not
    contiguous, not 16-byte aligned) copied, and negated for ``maximize``; the grid spans every
    chunk."""
    from numba_hopper.kernels.adamw import CHUNK, EXP_AVG, EXP_AVG_SQ, FIRST_CHUNK, NUMEL, PARAM
    from numba_hopper.torch.optim import fixed_columns, step_gradients

    sizes = [(CHUNK + 1,), (0,), (3, 7), (2 * CHUNK,)]
    params = [torch.zeros(s, dtype=torch.bfloat16) for s in sizes]
    params[0].grad = torch.ones(sizes[0], dtype=torch.bfloat16)
    params[1].grad = torch.ones(0, dtype=torch.bfloat16)
    params[2].grad = torch.ones(7, 3, dtype=torch.bfloat16).t()  # not contiguous
    params[3].grad = torch.ones(2 * CHUNK + 1, dtype=torch.bfloat16)[1:]  # starts 2 bytes in
    states = [{"step": torch.tensor(float(i + 1)), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
              for i, p in enumerate(params)]
    meta, chunks = fixed_columns(params, states)
    assert chunks == 2 + 0 + 1 + 2
    assert meta[:, FIRST_CHUNK].tolist() == [0, 2, 2, 3] and meta[:, NUMEL].tolist() == [CHUNK + 1, 0, 21, 2 * CHUNK]
    assert meta[:, PARAM].tolist() == [p.data_ptr() for p in params]
    assert meta[:, EXP_AVG].tolist() == [s["exp_avg"].data_ptr() for s in states]
    assert meta[:, EXP_AVG_SQ].tolist() == [s["exp_avg_sq"].data_ptr() for s in states]
    for maximize in (False, True):
        addresses, copies = step_gradients(params, torch.bfloat16, maximize)
        read = {t.data_ptr(): t for t in copies}
        for address, p in zip(addresses, params):
            g = read.get(address, p.grad)  # the gradient as the kernel reads it
            assert g.is_contiguous() and g.dtype == torch.bfloat16 and g.shape == p.shape
            assert torch.equal(g.float(), -p.grad.float() if maximize else p.grad.float())
        assert len(copies) == (2 + 4 if maximize else 2)


def test_a_launch_holds_while_its_tensors_stay():
    """A step reuses a launch (its checked table) only while its parameters' data and state
    tensors are the ones it was built from."""
    from numba_hopper.torch.optim import _Launch

    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)) for s in [(8,), (2, 8)]]
    state = {p: {"step": torch.tensor(float(i + 3)), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
             for i, p in enumerate(params)}
    launch = _Launch(params, [state[p] for p in params], torch.device("cpu"), torch.bfloat16)
    assert launch.holds(state)
    # the step counts, kept, now views of one tensor (a step adds to them at once)
    assert [state[p]["step"].item() for p in params] == [3.0, 4.0]
    assert all(state[p]["step"].untyped_storage().data_ptr() == launch.steps.untyped_storage().data_ptr() for p in params)
    kept = state[params[1]]
    state[params[1]] = {**kept, "exp_avg": torch.zeros_like(params[1])}  # new states, as load_state_dict makes
    assert not launch.holds(state)
    state[params[1]] = kept
    assert launch.holds(state)
    moment = kept["exp_avg_sq"]
    kept["exp_avg_sq"] = torch.zeros_like(params[1])  # a moment swapped in place
    assert not launch.holds(state)
    kept["exp_avg_sq"] = moment
    assert launch.holds(state)
    moment.data = torch.zeros_like(moment)  # a moment's data swapped
    assert not launch.holds(state)
    launch = _Launch(params, [state[p] for p in params], torch.device("cpu"), torch.bfloat16)
    assert launch.holds(state)
    params[0].data = torch.zeros(8, dtype=torch.bfloat16)  # new data
    assert not launch.holds(state)
