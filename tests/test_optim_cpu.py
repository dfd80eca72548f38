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
