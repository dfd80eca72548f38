"""The call path's plan keys (CPU): layouts decide a plan, addresses do not."""

import pytest
from _fakes import FakeCAI

import numba_hopper
from numba_hopper.matmul.fusion import fusion_args, fusion_key_and_values
from numba_hopper.matmul.plan import OUT, USER, VALUE_INDEX
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
    # one value per operand of the table, in its order: the numbers, and 0 for each absent array
    expected = [0] * (USER - OUT - 1)
    expected[VALUE_INDEX["alpha"] - OUT - 1], expected[VALUE_INDEX["bias"] - OUT - 1] = 2.0, BASE
    assert values == tuple(expected)
    assert _fused(bias=FakeCAI((8,), "<f4", ptr=BASE + 256), alpha=3.0, activation="relu")[0] == key
    assert _fused(bias=bias, alpha=1.0, activation="relu")[0] != key  # alpha == 1 compiles no multiply
    assert _fused(bias=bias, alpha=2.0, activation="gelu")[0] != key


@pytest.mark.parametrize("beta,counted", [(0.0, False), (1.0, True)])
def test_c_counts_only_when_read(beta, counted):
    key, values = _fused(c=FakeCAI((4, 8), "<f2", ptr=BASE), beta=beta)
    assert (values[VALUE_INDEX["c"] - OUT - 1] == BASE) is counted


def test_each_operand_of_the_table_lands_at_its_value():
    """Every operand row with a call value: given alone, its address (or number) is the only
    value that changes, at the plan's index for it, and its layout enters the key."""
    from numba_hopper.kernels.operands import OPERANDS

    plain_key, plain_values = _fused()
    for op in OPERANDS:
        if op.form == "args":
            continue
        given = 3.0 if op.form == "number" else FakeCAI((4, 8), "<f4", ptr=BASE + 4096)
        kw = {op.keyword: given, **({"beta": 1.0} if op.name == "c" else {})}
        if op.keyword in ("scale_a", "scale_b"):  # (the block-wise pair, as fold_scales gives it)
            kw = {"block_scales": (given, None) if op.keyword == "scale_a" else (None, given)}
        key, values = _fused(**kw)
        changed = {i for i, (x, y) in enumerate(zip(values, plain_values)) if x != y}
        at = VALUE_INDEX[op.name] - OUT - 1
        assert at in changed and values[at] == (3.0 if op.form == "number" else BASE + 4096), op
        assert changed <= {at, VALUE_INDEX["beta"] - OUT - 1}, (op, changed)
        assert key != plain_key, op


def test_the_kernel_arguments_are_the_tables_epilogue_rows():
    from numba_hopper.kernels.epilogue_config import EpilogueArgs, EpilogueConfig
    from numba_hopper.kernels.operands import OPERANDS

    rows = tuple(op.name for op in OPERANDS if op.kernel == "epilogue")
    assert EpilogueArgs._fields == rows
    every = EpilogueConfig(alpha=True, row_scale=True, col_scale=True, c_dtype="f32", bias="row", aux_dtype="f32",
                           user=_fused, out_scale="array", amax=True)
    assert every.arg_names == rows
