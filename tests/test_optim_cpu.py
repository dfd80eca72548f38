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
    # parameter, first and second moment read and written 16 bytes at a time, the gradient read
    assert r.count("LDG.E.128") == 3 and r.count("LDG.E.NA.128.CONSTANT") == 1, r.summary()
    assert r.count("STG.E.128") == 3, r.summary()
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
    """A launch's table: each tensor's addresses, size, first chunk and step; gradients that the
    kernel cannot read as they are (not contiguous, not 16-byte aligned) copied, and negated for
    ``maximize``; the grid spans every chunk."""
    from numba_hopper.kernels.adamw import CHUNK
    from numba_hopper.torch.optim import step_table

    sizes = [(CHUNK + 1,), (0,), (3, 7), (2 * CHUNK,)]
    params = [torch.zeros(s, dtype=torch.bfloat16) for s in sizes]
    params[0].grad = torch.ones(sizes[0], dtype=torch.bfloat16)
    params[1].grad = torch.ones(0, dtype=torch.bfloat16)
    params[2].grad = torch.ones(7, 3, dtype=torch.bfloat16).t()  # not contiguous
    params[3].grad = torch.ones(2 * CHUNK + 1, dtype=torch.bfloat16)[1:]  # starts 2 bytes in
    states = [{"step": torch.tensor(float(i + 1)), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
              for i, p in enumerate(params)]
    for maximize in (False, True):
        meta, chunks, copies = step_table(params, states, torch.bfloat16, maximize)
        assert chunks == 2 + 0 + 1 + 2
        assert meta[:, 5].tolist() == [0, 2, 2, 3] and meta[:, 4].tolist() == [CHUNK + 1, 0, 21, 2 * CHUNK]
        assert meta[:, 6].tolist() == [1, 2, 3, 4]
        assert meta[:, 0].tolist() == [p.data_ptr() for p in params]
        assert meta[:, 2].tolist() == [s["exp_avg"].data_ptr() for s in states]
        assert meta[:, 3].tolist() == [s["exp_avg_sq"].data_ptr() for s in states]
        read = {t.data_ptr(): t for t in copies}
        for row, p in zip(meta, params):
            g = read.get(int(row[1]), p.grad)  # the gradient as the kernel reads it
            assert g.is_contiguous() and g.dtype == torch.bfloat16 and g.shape == p.shape
            assert torch.equal(g.float(), -p.grad.float() if maximize else p.grad.float())
        assert len(copies) == (2 + 4 if maximize else 2)
