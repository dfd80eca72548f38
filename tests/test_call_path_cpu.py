"""The call path's plan keys (CPU): layouts decide a plan, addresses do not."""

import pytest
from _fakes import FakeCAI

import numba_hopper
from numba_hopper.matmul.fusion import fusion_args, fusion_key_and_values
from numba_hopper.runtime.operands import describe

BASE = 0x7F0000000000


def test_the_promised_names_are_at_the_top_level():
    assert callable(numba_hopper.gemm) and callable(numba_hopper.bmm)
    assert numba_hopper.GemmConfig().block_m == 128
    assert issubclass(numba_hopper.ShapeError, numba_hopper.NumbaHopperError)


def test_signature_ignores_the_address_but_not_its_alignment():
    sig, ptr = describe(FakeCAI((4, 8), "<f2", ptr=BASE))
    assert ptr == BASE
    assert describe(FakeCAI((4, 8), "<f2", ptr=BASE + 4096))[0] == sig
    assert describe(FakeCAI((4, 8), "<f2", ptr=BASE + 8))[0] != sig  # TMA needs 16-byte alignment
    assert describe(FakeCAI((4, 9), "<f2", ptr=BASE))[0] != sig
    assert describe(FakeCAI((4, 8), "<f2", ptr=BASE, strides=(32, 2)))[0] != sig
    assert describe(FakeCAI((4, 8), "<u2", ptr=BASE))[0] != sig


def test_host_arrays_have_no_signature():
    import numpy as np

    assert describe(np.zeros((4, 8)))[0] is None


def _fused(**kw):
    args = dict(alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None, aux_out=None,
                epilogue=None, epilogue_args=(), row_scale=None, col_scale=None)
    return fusion_key_and_values(fusion_args(**{**args, **kw}))


def test_epilogue_key_keeps_flags_and_layouts_and_values_keep_addresses_and_scalars():
    bias = FakeCAI((8,), "<f4", ptr=BASE)
    key, values = _fused(bias=bias, alpha=2.0, activation="relu")
    # c, row_scale, col_scale, bias, aux, block scales, scale_out, amax_out, up
    assert values == (2.0, 0.0, 0, 0, 0, BASE, 0, 0, 0, 0, 0, 0)
    assert _fused(bias=FakeCAI((8,), "<f4", ptr=BASE + 256), alpha=3.0, activation="relu")[0] == key
    assert _fused(bias=bias, alpha=1.0, activation="relu")[0] != key  # alpha == 1 compiles no multiply
    assert _fused(bias=bias, alpha=2.0, activation="gelu")[0] != key


@pytest.mark.parametrize("beta,counted", [(0.0, False), (1.0, True)])
def test_c_counts_only_when_read(beta, counted):
    key, values = _fused(c=FakeCAI((4, 8), "<f2", ptr=BASE), beta=beta)
    assert (values[2] == BASE) is counted
