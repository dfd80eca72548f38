"""Bad input, fuzzed (hypothesis): every public entry point refuses it before launch with a clear
exception, and valid input gets as far as the device check.

numba_hopper.gemm / bmm / grouped_gemm take fake device arrays (``_fakes.FakeCAI``: layouts
and addresses, no memory). Two kinds of input: anything at all (arrays of any shape, element
type, strides and address, each in one of a few address windows, so that some overlap; and
things that are no arrays), and a valid call with one argument changed. A call must raise a
``NumbaHopperError``, or the TypeError / ValueError the docstrings name, with a message:
never an AttributeError, IndexError, KeyError, ZeroDivisionError and the like. On this
machine, which has no GPU, a valid call raises ``UnsupportedDeviceError``, the last check
before a plan is built.

numba_hopper.torch's functions take CPU tensors: torch's own errors are RuntimeErrors (shapes),
and a valid call reaches numba_hopper, which refuses a CPU tensor with a TypeError.
"""

import numpy as np
import pytest
from _fakes import FakeCAI
from hypothesis import HealthCheck, example, given, settings, strategies as st

from numba_hopper import GemmConfig, bmm, gemm, grouped_gemm
from numba_hopper.errors import NumbaHopperError, UnsupportedDeviceError

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow],
                report_multiple_bugs=False)  # (a failure shrinks one example: seconds, not minutes)
VALID = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

BASE, WINDOW = 0x7F00_0000_0000, 1 << 34  # arrays in windows of 16 GiB
REFUSALS = (NumbaHopperError, TypeError, ValueError)

TYPESTRS = st.sampled_from(["<f2", "<u2", "|u1", "<f4", "<f8", "<i4", "<i8", "|b1", "<c8", "<V2", "zz"])
DTYPE_NAMES = st.sampled_from([None, "bf16", "f16", "f32", "e4m3", "e5m2", "tf32", "u8", "f64", "", "bogus", 1])
DIM = st.one_of(st.integers(0, 3), st.sampled_from([7, 16, 127, 128, 129, 1000]), st.integers(-2, -1))


@st.composite
def fake_arrays(draw, ndim=None):
    nd = draw(st.integers(0, 4) if ndim is None else st.just(ndim))
    shape = draw(st.lists(DIM, min_size=nd, max_size=nd))
    strides = draw(st.one_of(st.none(), st.lists(st.sampled_from([-2, 0, 1, 2, 3, 16, 32, 2000, 4096]),
                                                  min_size=nd, max_size=nd)))
    ptr = BASE + draw(st.integers(0, 7)) * WINDOW + draw(st.sampled_from([0, 0, 0, 1, 2, 8]))
    mask = draw(st.sampled_from([None] * 9 + [object()]))
    return FakeCAI(shape, draw(TYPESTRS), ptr=ptr, strides=strides, mask=mask)


JUNK = st.sampled_from([None, 0, -1, 2.5, float("nan"), "x", b"x", [1, 2], (1,), np.zeros((2, 2), np.float16), object()])
ARRAYS = st.one_of(fake_arrays(), fake_arrays(ndim=1), fake_arrays(ndim=2), JUNK)
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 2), JUNK)
ACTIVATIONS = st.sampled_from([None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid"])
SCALES = st.one_of(NUMBERS, ARRAYS)
COMMON = {  # the keywords of every entry point
    "out": st.one_of(st.none(), ARRAYS), "out_dtype": DTYPE_NAMES, "dtype": DTYPE_NAMES, "stream": st.sampled_from([None, 0, -1, True, "s", 2.5, object()]),
    "config": st.sampled_from([None, GemmConfig(), GemmConfig(block_m=64, block_n=128),
                               GemmConfig(block_n=128, stream_k=True), GemmConfig(cluster_n=2), "bogus", 3, [1]]),
}
KEYWORDS = {
    gemm: {**COMMON, "alpha": NUMBERS, "beta": NUMBERS, "c": ARRAYS, "bias": ARRAYS,
           "bias_dim": st.sampled_from([None, 0, 1, 2, -1, "1", 1.0]),
           "activation": st.one_of(ACTIVATIONS, st.sampled_from(["tanh", "", 3])), "aux_out": ARRAYS,
           "epilogue": st.sampled_from([None, "f", len, lambda v, r, c: v]),
           "epilogue_args": st.sampled_from([(), (1,), (1.5, 2), "ab", None]), "row_scale": ARRAYS,
           "col_scale": ARRAYS, "scale_a": SCALES, "scale_b": SCALES, "scale_out": SCALES, "amax_out": ARRAYS,
           "up": ARRAYS, "split_k": st.sampled_from([None, 1, 3, 0, -1, True, 2.5, "2"]),
           "debug": st.sampled_from([None, False, True])},
    bmm: COMMON,
    grouped_gemm: {**COMMON, "offsets": ARRAYS, "masked_m": ARRAYS, "row_scale": ARRAYS,
                   "activation": st.one_of(ACTIVATIONS, st.sampled_from(["tanh", 3])), "scale_a": SCALES,
                   "scale_b": SCALES, "debug": st.sampled_from([None, False])},
}


def _refused(call):
    """Run ``call``, which cannot succeed here; the exception it raised, if it is one allowed."""
    try:
        call()
    except REFUSALS as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return exc
    raise AssertionError("a call succeeded on a machine without a GPU")


@FUZZ
@pytest.mark.parametrize("fn", [gemm, bmm, grouped_gemm], ids=lambda fn: fn.__name__)
@given(a=ARRAYS, b=st.one_of(ARRAYS, fake_arrays(ndim=3)), data=st.data())
def test_anything_is_refused_clearly(fn, a, b, data):
    keys = data.draw(st.sets(st.sampled_from(sorted(KEYWORDS[fn])), max_size=5), label="keywords")
    kw = {k: data.draw(KEYWORDS[fn][k], label=k) for k in sorted(keys)}
    _refused(lambda: fn(a, b, **kw))


# --- valid calls, and valid calls with one argument changed --------------------------------------


class _Addresses:
    """Aligned, far-apart base addresses: valid operands never overlap."""

    def __init__(self):
        self.next = BASE

    def __call__(self):
        self.next += WINDOW
        return self.next


def _matrix(addr, rows, cols, typestr, major="R", pitch=None):
    """A (rows, cols) fake array, row- or column-major, its leading dimension ``pitch`` (in
    elements; default the extent)."""
    item = np.dtype(typestr).itemsize
    if major == "R":
        return FakeCAI((rows, cols), typestr, ptr=addr(), strides=(item * (pitch or cols), item))
    return FakeCAI((rows, cols), typestr, ptr=addr(), strides=(item, item * (pitch or rows)))


def _array(addr, shape, typestr="<f4"):
    return FakeCAI(shape, typestr, ptr=addr())


SIZES = st.sampled_from([1, 7, 16, 127, 128, 129, 1000])


@st.composite
def gemm_calls(draw):
    """A valid 16-bit gemm call, ``(gemm, a, b, keywords)``: any layout, a padded leading
    dimension, an output given or not, and a few parts of the fused epilogue."""
    M, N, K = draw(SIZES), draw(SIZES), draw(SIZES)
    layout = draw(st.sampled_from(["RR", "RC", "CR", "CC"]))
    dtype, out_dtype = draw(st.sampled_from(["bf16", "f16"])), draw(st.sampled_from([None, "bf16", "f16", "f32"]))
    addr, ts = _Addresses(), {"bf16": "<u2", "f16": "<f2"}[dtype]
    a = _matrix(addr, M, K, ts, layout[0], pitch=(K if layout[0] == "R" else M) + draw(st.sampled_from([0, 1, 8])))
    b = _matrix(addr, K, N, ts, layout[1])
    name = out_dtype or dtype
    out_ts = {"bf16": "<u2", "f16": "<f2", "f32": "<f4"}[name]
    kw = {"out": _matrix(addr, M, N, out_ts) if draw(st.booleans()) else None}
    if ts == "<u2":
        kw["dtype"] = dtype
    if out_dtype is not None or (kw["out"] is not None and out_ts == "<u2"):  # (uint16 holds bf16 when told so)
        kw["out_dtype"] = name
    parts = ["alpha", "c", "bias_col", "bias_row", "activation", "aux_out", "scales"]
    for part in draw(st.sets(st.sampled_from(parts), max_size=4)):
        if part == "alpha":
            kw["alpha"] = 0.5
        elif part == "c":
            kw.update(c=_matrix(addr, M, N, draw(st.sampled_from(["<f2", "<f4"]))), beta=2.0)
        elif part in ("bias_col", "bias_row") and "bias" not in kw:
            kw.update(bias=_array(addr, (N if part == "bias_col" else M,)), bias_dim=int(part == "bias_col"))
        elif part == "activation":
            kw["activation"] = draw(ACTIVATIONS)
        elif part == "aux_out":
            kw["aux_out"] = _matrix(addr, M, N, "<f4")
        elif part == "scales":
            kw.update(row_scale=_array(addr, (M,)), col_scale=_array(addr, (N,)))
    return gemm, a, b, kw


@st.composite
def fp8_gemm_calls(draw):
    """A valid fp8 gemm call (TN), unscaled or with per-tensor, row-wise or block-wise scales."""
    M, N, K = draw(SIZES), draw(SIZES), draw(st.sampled_from([16, 128, 144, 1024]))
    addr = _Addresses()
    a, b = _matrix(addr, M, K, "|u1"), _matrix(addr, K, N, "|u1", "C")  # b: w.t() of a row-major (N, K) w
    kb, nb = -(-K // 128), -(-N // 128)
    scales = {"none": (None, None), "number": (0.5, 2.0), "scalar": (_array(addr, (1,)), _array(addr, (1,))),
              "rowwise": (_array(addr, (M,)), _array(addr, (N,))),
              "block": (_matrix(addr, M, kb, "<f4", "C"), _matrix(addr, kb, nb, "<f4", "C"))}
    scale_a, scale_b = scales[draw(st.sampled_from(sorted(scales)))]
    return gemm, a, b, dict(dtype=draw(st.sampled_from(["e4m3", "e5m2"])), scale_a=scale_a, scale_b=scale_b)


@st.composite
def bmm_calls(draw):
    """A valid bmm call: 16-byte-aligned batches, one operand 2-D (broadcast) or not."""
    batch, M, N, K = draw(st.sampled_from([1, 3])), draw(SIZES), draw(st.sampled_from([8, 16, 1000])), \
        draw(st.sampled_from([8, 64, 200]))
    broadcast, ts = draw(st.sampled_from([None, "a", "b"])), draw(st.sampled_from(["<f2", "<u2"]))
    addr = _Addresses()
    a = _array(addr, (M, K) if broadcast == "a" else (batch, M, K), ts)
    b = _array(addr, (K, N) if broadcast == "b" else (batch, K, N), ts)
    return bmm, a, b, {"dtype": "bf16"} if ts == "<u2" else {}


@st.composite
def grouped_gemm_calls(draw):
    """A valid grouped call, contiguous or masked, bf16 (with a row scale and activation or
    not) or fp8 with block-wise scales."""
    G, M, N = draw(st.sampled_from([1, 4, 9])), draw(SIZES), draw(st.sampled_from([8, 64, 320]))
    K, masked, fp8 = draw(st.sampled_from([16, 208, 656])), draw(st.booleans()), draw(st.booleans())
    addr = _Addresses()
    ts = "|u1" if fp8 else "<u2"
    rows = (G, M) if masked else (M,)
    a = _array(addr, (*rows, K), ts)
    b = FakeCAI((G, K, N), ts, ptr=addr(), strides=(N * K, 1, K) if fp8 else None)  # fp8: each b[g] K-major
    kw = {"masked_m" if masked else "offsets": _array(addr, (G,), "<i4"), "dtype": "e4m3" if fp8 else "bf16"}
    kb, nb = -(-K // 128), -(-N // 128)
    if fp8:
        kw.update(scale_a=_array(addr, (*rows, kb)), scale_b=_array(addr, (G, kb, nb)))
    elif draw(st.booleans()):
        kw.update(row_scale=_array(addr, rows), activation=draw(ACTIVATIONS))
    return grouped_gemm, a, b, kw


VALID_CALLS = {"gemm": gemm_calls(), "fp8 gemm": fp8_gemm_calls(), "bmm": bmm_calls(),
               "grouped_gemm": grouped_gemm_calls()}


@VALID
@pytest.mark.parametrize("kind", sorted(VALID_CALLS))
@given(data=st.data())
def test_a_valid_call_reaches_the_device_check(kind, data):
    fn, a, b, kw = data.draw(VALID_CALLS[kind], label="call")
    with pytest.raises(UnsupportedDeviceError):
        fn(a, b, **kw)


@st.composite
def mutants(draw, x):
    """``x`` (a fake array) with one thing changed: a dimension, the element type, the strides or
    the address; or something else altogether."""
    cai = dict(x.__cuda_array_interface__)
    shape, strides = list(cai["shape"]), cai["strides"]
    what = draw(st.sampled_from(["dim", "typestr", "strides", "address", "other"]))
    if what == "dim" and shape:
        i = draw(st.integers(0, len(shape) - 1))
        shape[i] = max(shape[i] + draw(st.sampled_from([-1, 1, 16])), 0)
        strides = None if strides is None or draw(st.booleans()) else strides
    elif what == "typestr":
        cai["typestr"] = draw(TYPESTRS)
    elif what == "strides" and shape:
        strides = tuple(reversed(strides or (1,) * len(shape)))
    elif what == "address":
        cai["data"] = (cai["data"][0] + draw(st.sampled_from([1, 2, 8, -WINDOW])), False)
    else:
        return draw(ARRAYS)
    return FakeCAI(shape, cai["typestr"], ptr=cai["data"][0], strides=strides)


@FUZZ
@pytest.mark.parametrize("kind", sorted(VALID_CALLS))
@given(data=st.data())
def test_a_valid_call_with_one_argument_changed_is_refused_clearly_or_valid(kind, data):
    fn, a, b, kw = data.draw(VALID_CALLS[kind], label="call")
    args = {"a": a, "b": b, **kw}
    name = data.draw(st.sampled_from(sorted(set(args) | set(KEYWORDS[fn]))), label="changed")
    old = args.get(name)
    args[name] = data.draw(mutants(old) if isinstance(old, FakeCAI) else KEYWORDS[fn].get(name, ARRAYS), label=name)
    try:
        fn(args.pop("a"), args.pop("b"), **args)
    except UnsupportedDeviceError:  # the change kept it valid
        return
    except REFUSALS as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
    else:
        raise AssertionError("a call succeeded on a machine without a GPU")


# --- numba_hopper.torch, on CPU tensors ---------------------------------------------------------

try:
    import torch

    import numba_hopper.torch as nht
except ImportError:
    torch = nht = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

TORCH_REFUSALS = REFUSALS + (RuntimeError,)  # (torch's own shape errors are RuntimeErrors)
TORCH_DTYPES = st.sampled_from(["bfloat16", "float16", "float32", "float64", "int32", "float8_e4m3fn"])


@st.composite
def tensors(draw, ndim=None):
    """A small CPU tensor of any dtype and rank, transposed or not, requiring grad or not."""
    nd = draw(st.integers(0, 4) if ndim is None else st.just(ndim))
    shape = draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 16]), min_size=nd, max_size=nd))
    dtype = getattr(torch, draw(TORCH_DTYPES))
    t = torch.zeros(shape, dtype=dtype)
    if draw(st.booleans()) and nd >= 2:
        t = t.transpose(-1, -2)
    if dtype.is_floating_point and dtype != torch.float8_e4m3fn and draw(st.booleans()):
        t.requires_grad_()
    return t


TENSORS = st.one_of(tensors(), tensors(ndim=2), tensors(ndim=3), st.sampled_from([None, 1.5, "x"]))


def _torch_refused(call):
    try:
        call()
    except TORCH_REFUSALS as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return exc
    raise AssertionError("a call succeeded on CPU tensors")


@needs_torch
@FUZZ
@given(fn=st.sampled_from(["mm", "bmm", "matmul", "addmm", "baddbmm", "linear"]), x=TENSORS, y=TENSORS, z=TENSORS,
       alpha=st.sampled_from([1, 0.5, 0]), beta=st.sampled_from([1, 0, 2.0]), activation=ACTIVATIONS)
@example(fn="mm", x=None, y=None, z=None, alpha=1, beta=1, activation=None)  # no tensors at all
def test_torch_functions_refuse_bad_input_clearly(fn, x, y, z, alpha, beta, activation):
    calls = {"mm": lambda: nht.mm(x, y), "bmm": lambda: nht.bmm(x, y), "matmul": lambda: nht.matmul(x, y),
             "addmm": lambda: nht.addmm(z, x, y, beta=beta, alpha=alpha),
             "baddbmm": lambda: nht.baddbmm(z, x, y, beta=beta, alpha=alpha),
             "linear": lambda: nht.linear(x, y, z, activation=activation)}
    _torch_refused(calls[fn])


@needs_torch
@VALID
@given(fn=st.sampled_from(["mm", "bmm", "matmul", "addmm", "baddbmm", "linear"]), M=st.sampled_from([0, 1, 7, 16]),
       N=st.sampled_from([1, 8, 16]), K=st.sampled_from([1, 16]), dtype=st.sampled_from(["bfloat16", "float16"]),
       grad=st.booleans())
@example(fn="addmm", M=0, N=8, K=16, dtype="bfloat16", grad=False)  # no rows: torch returns (0, N)
def test_valid_torch_calls_reach_numba_hopper(fn, M, N, K, dtype, grad):
    def t(*shape):
        return torch.randn(*shape, dtype=getattr(torch, dtype)).requires_grad_(grad)

    calls = {"mm": lambda: nht.mm(t(M, K), t(K, N)), "bmm": lambda: nht.bmm(t(3, M, K), t(3, K, N)),
             "matmul": lambda: nht.matmul(t(2, M, K), t(K, N)), "addmm": lambda: nht.addmm(t(N), t(M, K), t(K, N)),
             "baddbmm": lambda: nht.baddbmm(t(3, M, N), t(3, M, K), t(3, K, N)),
             "linear": lambda: nht.linear(t(M, K), t(N, K), t(N), activation="relu")}
    with pytest.raises(TypeError, match="not a CUDA device array"):
        calls[fn]()
