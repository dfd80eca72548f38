"""The prebuilt kernels (CPU): the set the prebuilder finds, the entries it writes, and when
the kernel cache loads them."""

import itertools
import json
import pickle
import pickletools
import types

import pytest
from numba.cuda.api_util import prepare_shape_strides_dtype
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from numba_hopper.matmul import api as _api
from numba_hopper.matmul import fusion as _fusion
from numba_hopper.matmul import grouped as _grouped
from numba_hopper.matmul import heuristics as _heuristics
from numba_hopper.matmul import plan as _plan

from numba_hopper.tools import prebuild
from numba_hopper.runtime import kernel_cache as kc
from numba_hopper import _numba_internals as internals
from numba_hopper.runtime.arrays import DeviceView
from numba_hopper.kernels import gemm_argument_types

# (One xdist worker runs this module, which builds its module fixtures once: tests/conftest.py.)

BASE = 1 << 30  # a 16-byte-aligned address that is never dereferenced


def _view(rows, cols, row_major=True, dtype="bf16", ptr=BASE):
    return DeviceView(ptr, (rows, cols), (cols, 1) if row_major else (1, rows), dtype, 2, 0, "numba")


@pytest.fixture
def h100(monkeypatch):
    """The planner sees an H100 (no driver needed)."""
    for module in (_plan, _heuristics):
        monkeypatch.setattr(module, "device_limits", lambda device=0: prebuild.H100)


@pytest.fixture(scope="module")
def bf16_walk():
    """``(the kernel set, the cases refused)`` of the walks with bf16 as the 16-bit dtype (every
    family): one walk for the module."""
    refused = []
    return prebuild.kernel_set(("bf16",), refused=refused), refused


@pytest.fixture(scope="module")
def bf16_set(bf16_walk):
    return bf16_walk[0]


@pytest.fixture(scope="module")
def bf16_entries(bf16_set):
    return {kernel.entry for kernel in bf16_set}


def _plain(cfgs):
    """The kernels of plain configs (no epilogue arrays, no block-wise scales)."""
    return {prebuild.Kernel(cfg, gemm_argument_types(cfg)) for cfg in cfgs}


GEMMS = {  # (M, N, K, A row-major, B row-major)
    "square": (2048, 2048, 2048, True, True),
    "x @ W.T": (4096, 4096, 4096, True, False),
    "A column-major": (4096, 4096, 4096, False, True),
    "decode, split-K": (1, 4096, 14336, True, False),
    "few tiles, split-K": (256, 256, 16384, True, True),
    "clustered": (16384, 4096, 4096, True, True),
    "one wave of 160-wide tiles": (1792, 1280, 4096, True, True),
    "unaligned, copied": (1000, 1001, 333, True, True),
    "rows straddling sectors": (4096, 3000, 3000, True, False),
}


@pytest.mark.parametrize("case", list(GEMMS))
def test_the_set_holds_what_gemm_plans(case, bf16_set, h100):
    M, N, K, a_row, b_row = GEMMS[case]
    plan = _plan.gemm_plan(_view(M, K, a_row), _view(K, N, b_row), _view(M, N), None, None, False)
    configs = [spec.cfg for spec in plan.specs if isinstance(spec, _plan._Gemm)]
    assert configs and _plain(configs) <= bf16_set, configs


@pytest.mark.parametrize("batch, M, N, K", [(8, 512, 512, 512), (64, 128, 1024, 1024), (3, 4096, 4096, 4096)])
def test_the_set_holds_what_bmm_plans(batch, M, N, K, bf16_set, h100):
    a, b, out = _view(M, K), _view(K, N), _view(M, N)
    plan = _plan.bmm_plan(a, b, out, batch, (M * K, K * N, M * N), None)
    assert _plain(spec.cfg for spec in plan.specs) <= bf16_set


def test_the_heuristics_plan_every_shape_of_the_walk(bf16_walk):
    """No shape of the walk is refused (batched 64-row tiles were once given a cluster they cannot run)."""
    assert bf16_walk[1] == []


def test_the_gemm_family_is_plain_kernels_of_16_bit_inputs(bf16_set):
    gemms = [k.cfg for k in bf16_set if k.family == "gemm"]
    assert 10 < len(gemms) < 150
    assert all(c.epilogue is None and not c.debug and not c.stream_k and c.grouped is None for c in gemms)
    assert {(c.in_dtype, c.out_dtype) for c in gemms} == {("bf16", "bf16"), ("bf16", "f32")}
    assert {(c.a_major, c.b_major) for c in gemms} == {("K", "K"), ("K", "N"), ("M", "K"), ("M", "N")}


def test_the_fp8_family_is_scaled_tn_kernels(bf16_set):
    fp8 = [k.cfg for k in bf16_set if k.family == "fp8"]
    assert 20 < len(fp8) < 200
    assert {(c.in_dtype, c.b_type, c.out_dtype) for c in fp8} == {
        (a, b, out) for (a, b), out in itertools.product(prebuild.FP8_PAIRS, prebuild.FP8_OUTS)}
    assert {(c.a_major, c.b_major, c.out_major) for c in fp8} == {("K", "K", "N")}
    assert all(c.epilogue is not None and not c.debug and c.grouped is None for c in fp8)  # (scaled: never plain)
    assert any(c.block_scaled for c in fp8) and not all(c.block_scaled for c in fp8)
    assert all(c.promoted for c in fp8)  # (the default accumulation)


def test_the_grouped_family_is_both_modes_of_bf16_and_promoted_e4m3(bf16_set):
    grouped = [k.cfg for k in bf16_set if k.family == "grouped"]
    assert {(c.grouped, c.in_dtype, c.out_dtype, c.block_scaled, c.promoted) for c in grouped} == {
        (mode, *case) for mode in ("contiguous", "masked")
        for case in (("bf16", "bf16", False, False), *itertools.product(("e4m3",), ("bf16", "f16"), (True, False),
                                                                         (True,)))}
    assert {c.b_major for c in grouped if c.in_dtype == "bf16"} == {"K", "N"}


# --- what a launch looks up -------------------------------------------------------------


class Prepared(Exception):
    """What the stubbed ``prepare_launch`` raises: ``(cache key, argument types)`` of the launch."""


def _unbacked_array(desc, owner=None, sync=True):
    """``cuda.from_cuda_array_interface``'s array over no memory (no device): typed alike."""
    shape, strides, dtype = prepare_shape_strides_dtype(desc["shape"], desc.get("strides"), desc["typestr"], order="C")
    return DeviceNDArray(shape, strides, dtype, gpu_data=object())


@pytest.fixture
def lookup(monkeypatch):
    """``lookup(gemm) -> (cache key, argument types)`` of the launch a plan's ``_Gemm`` prepares,
    on an H100, without a driver."""

    def prepare_launch(kernel, grid, block, args, cache_key=None, **kw):
        raise Prepared(cache_key, internals.arg_types(kernel, args))

    monkeypatch.setattr(_plan, "device_limits", lambda device=0: prebuild.H100)
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    monkeypatch.setattr(_plan, "max_active_clusters", lambda *a, **kw: 1)
    monkeypatch.setattr(_plan, "tpc_order", lambda device: 0)
    monkeypatch.setattr(_plan, "encode_template", lambda *a, **kw: types.SimpleNamespace(words=(0,) * 16))  # (driver)
    monkeypatch.setattr(_fusion.cuda, "from_cuda_array_interface", _unbacked_array)

    def lookup(gemm):
        with pytest.raises(Prepared) as launched:
            gemm.prepare([BASE] * (_plan.USER + 1))  # (every value an aligned address)
        return launched.value.args

    return lookup


@pytest.fixture
def launched(lookup, monkeypatch):
    """``launched(call) -> [entry name]``: the kernel-cache entries the GEMM launches of a real
    call look up (``call(torch)`` on CPU tensors seen as an H100's: tests/_torch_double.py)."""
    torch = pytest.importorskip("torch")
    double = pytest.importorskip("_torch_double")
    double.install(monkeypatch)
    monkeypatch.setattr(_api, "gemm", double._REAL_GEMM)  # (the real one: plans only, no float64 product)
    monkeypatch.setattr(_grouped, "plans", {})

    def launched(call):
        double.PLANS.clear()
        call(torch)
        (plan,) = double.PLANS
        gemms = [spec for spec in plan.specs if isinstance(spec, _plan._Gemm)]
        assert gemms
        return [kc.entry_name(*lookup(gemm), prebuild.H100.cc) for gemm in gemms]

    return launched


def _scales(torch, scaling, M, N, K):
    """``(scale_a, scale_b)`` as ``torch._scaled_mm`` takes them (benchmarks/bench_fp8.py)."""
    kb, nb = -(-K // 128), -(-N // 128)
    return {"tensor": lambda: (torch.tensor(0.75), torch.tensor(1.5)),
            "number": lambda: (0.75, 1.5),
            "rowwise": lambda: (torch.empty(M, 1), torch.empty(1, N)),
            "blockwise": lambda: (torch.empty(kb, M).t(), torch.empty(nb, kb).t())}[scaling]()


FP8_GEMMS = {  # (M, N, K, scaling, a dtype, b dtype, out_dtype): benchmarks/first_call.py's, bench_fp8.py's, ...
    "per-tensor 4096^3": (4096, 4096, 4096, "tensor", "e4m3", "e4m3", None),
    "per-tensor decode": (1, 4096, 7168, "tensor", "e4m3", "e4m3", None),  # (torch's one-element row scale)
    "per-tensor numbers, dgrad, f16": (2048, 7168, 2048, "number", "e5m2", "e4m3", "f16"),
    "row-wise 4096^3": (4096, 4096, 4096, "rowwise", "e4m3", "e4m3", None),
    "row-wise 128x7168x16384": (128, 7168, 16384, "rowwise", "e4m3", "e4m3", None),
    "row-wise, out copied": (1000, 1001, 512, "rowwise", "e4m3", "e4m3", "bf16"),
    "block-wise 4096^3": (4096, 4096, 4096, "blockwise", "e4m3", "e4m3", None),
    "block-wise 4096x7168x16384": (4096, 7168, 16384, "blockwise", "e4m3", "e4m3", None),
    "block-wise 128x2112x7168": (128, 2112, 7168, "blockwise", "e4m3", "e4m3", None),
    "block-wise dgrad, f16": (4096, 2048, 7168, "blockwise", "e5m2", "e4m3", "f16"),
}


@pytest.mark.parametrize("case", list(FP8_GEMMS))
def test_the_set_holds_what_fp8_gemm_launches(case, launched, bf16_entries):
    M, N, K, scaling, a_dtype, b_dtype, out_dtype = FP8_GEMMS[case]

    def call(torch):
        dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
        a, b = torch.empty(M, K, dtype=dt[a_dtype]), torch.empty(N, K, dtype=dt[b_dtype]).t()
        scale_a, scale_b = _scales(torch, scaling, M, N, K)
        _api.gemm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, stream=0)

    assert set(launched(call)) <= bf16_entries


GROUPED = {  # (masked, G, rows per group, N, K, dtype, out_dtype): first_call.py's, bench_grouped.py's, ...
    "bf16 dsv3 up G=8": (False, 8, 2048, 4096, 7168, "bf16", None),
    "bf16 masked decode G=16": (True, 16, 256, 7168, 2048, "bf16", None),
    "e4m3 dsv3 up G=8": (False, 8, 2048, 4096, 7168, "e4m3", None),
    "e4m3 dsv3 down G=32": (False, 32, 512, 7168, 2048, "e4m3", None),
    "e4m3 masked decode G=16, f16": (True, 16, 256, 4096, 7168, "e4m3", "f16"),
}


@pytest.mark.parametrize("case", list(GROUPED))
def test_the_set_holds_what_grouped_gemm_launches(case, launched, bf16_entries):
    masked, G, rows, N, K, dtype, out_dtype = GROUPED[case]

    def call(torch):
        dt = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[dtype]
        kb, nb = -(-K // 128), -(-N // 128)
        b = torch.empty(G, N, K, dtype=dt).transpose(1, 2)  # (the experts' weights, as the benchmark's)
        scales = {}
        if dtype == "e4m3":  # block-wise, each matrix column-major (benchmarks/bench_grouped.py)
            scale_a = torch.empty(G, kb, rows).transpose(1, 2) if masked else torch.empty(kb, G * rows).t()
            scales = {"scale_a": scale_a, "scale_b": torch.empty(G, nb, kb).transpose(1, 2)}
        sizes = torch.full((G,), rows, dtype=torch.int32)
        if masked:
            _grouped.grouped_gemm(torch.empty(G, rows, K, dtype=dt), b, masked_m=sizes, out_dtype=out_dtype, stream=0,
                                  **scales)
        else:
            _grouped.grouped_gemm(torch.empty(G * rows, K, dtype=dt), b, sizes.cumsum(0, dtype=torch.int32),
                                  out_dtype=out_dtype, stream=0, **scales)

    assert set(launched(call)) <= bf16_entries


# --- one real build: its entry is what a launch looks up --------------------------------


def _smallest(kernels):
    """The quickest kernel of the set to compile (few stages, small tile): a plain one, K-major
    A, N-major B."""
    return min((k for k in kernels if k.family == "gemm" and (k.cfg.a_major, k.cfg.b_major, k.cfg.out_dtype)
                == ("K", "N", "bf16")), key=lambda k: (k.cfg.block_m * k.cfg.block_n, k.cfg.stages))


@pytest.fixture(scope="module")
def built(bf16_set, tmp_path_factory):
    kernel = _smallest(bf16_set)
    out = tmp_path_factory.mktemp("prebuilt") / "set"
    manifest = prebuild.build(out, [kernel], jobs=1)
    return kernel.cfg, out, manifest


def test_the_entry_is_named_as_the_launch_looks_it_up(built, lookup, monkeypatch, tmp_path):
    cfg, out, manifest = built
    monkeypatch.setenv("NUMBA_HOPPER_CACHE_DIR", str(tmp_path))
    M, N, K = 256, 512, 1024
    operands = [_plan.Operand(v, _plan.Src(i)) for v, i in
                ((_view(M, K), _plan.A), (_view(K, N), _plan.B), (_view(M, N), _plan.OUT))]
    key, argtypes = lookup(_plan._Gemm(cfg, *operands, _plan._Batch(), _plan._Scratch()))
    assert argtypes == gemm_argument_types(cfg)
    name = kc.entry_name(key, argtypes, prebuild.H100.cc)
    assert name == kc.entry_path(key, argtypes, (9, 0)).name
    assert manifest["entries"] == {name: repr(cfg)}
    assert sorted(p.name for p in out.iterdir()) == sorted([name, kc.MANIFEST])


def test_the_manifest_names_what_the_loader_checks(built):
    _, out, manifest = built
    assert json.loads((out / kc.MANIFEST).read_text()) == manifest
    assert manifest["package_digest"] == kc.build_identity()["package_digest"]
    assert manifest["numba_cuda"] == kc.build_identity()["numba_cuda"]
    assert int(manifest["linked_with_cuda"].split(".")[0]) >= 12


def test_the_entry_is_a_cubin_for_sm_90a_and_nothing_else(built):
    cfg, out, manifest = built
    (name,) = manifest["entries"]
    data = (out / name).read_bytes()
    assert len(data) < 64 * 1024
    library = pickle.loads(data)["codelibrary"]
    assert library["llvm_strs"] == [] and library["ptx_cache"] == {}
    assert list(library["cubin_cache"]) == [(9, 0, "a")]
    kernel = internals.cubin_kernel(data)
    assert kernel.argument_types == gemm_argument_types(cfg)


def test_the_entry_holds_no_python_bytecode(built):
    """Everything is pickled by reference, so an entry loads under any Python version."""
    _, out, manifest = built
    data = (out / next(iter(manifest["entries"]))).read_bytes()
    strings = [arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
    assert not [s for s in strings if "cloudpickle" in s or s in ("CodeType", "_make_function")]


def test_a_corrupt_entry_raises_so_the_cache_compiles_instead():
    with pytest.raises(Exception):
        internals.cubin_kernel(b"not a pickle")


# --- when the kernel cache uses the prebuilt kernels (numba stubbed) --------------------


class FakeDispatcher:
    def __init__(self):
        self.overloads, self.compiles = {}, 0


ARGTYPES = ("int64",)


@pytest.fixture
def prebuilt(tmp_path, monkeypatch):
    """A prebuilt directory holding the entry of ("cfg", ARGTYPES), a user cache, a CUDA 13.0
    driver, and numba's compile and loading stubbed."""
    monkeypatch.setenv("NUMBA_HOPPER_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.delenv("NUMBA_HOPPER_PREBUILT", raising=False)
    directory = tmp_path / "prebuilt"
    directory.mkdir()
    monkeypatch.setattr(kc, "PREBUILT_DIR", directory)
    monkeypatch.setattr(kc, "_driver_cuda_version", lambda: 13000)
    write_manifest(directory)
    (directory / kc.entry_name("cfg", ARGTYPES, (9, 0))).write_bytes(pickle.dumps("prebuilt kernel"))

    def compile_(d, args):
        d.compiles += 1
        d.overloads[ARGTYPES] = "compiled kernel"
        return d.overloads[ARGTYPES]

    def add(d, data):
        d.overloads[ARGTYPES] = pickle.loads(data)
        return d.overloads[ARGTYPES]

    monkeypatch.setattr(internals, "arg_types", lambda d, args: ARGTYPES)
    monkeypatch.setattr(internals, "has_overload", lambda d, types: types in d.overloads)
    monkeypatch.setattr(internals, "kernel_for_args", lambda d, args: d.overloads.get(ARGTYPES) or compile_(d, args))
    monkeypatch.setattr(internals, "serialize_kernel", pickle.dumps)
    monkeypatch.setattr(internals, "add_serialized_kernel", add)
    monkeypatch.setattr(internals, "add_cubin_kernel", add)
    return directory


def write_manifest(directory, **changes):
    fields = {**kc.build_identity(), "linked_with_cuda": "13.5", **changes}
    (directory / kc.MANIFEST).write_text(json.dumps(fields))


def _lookup():
    d = FakeDispatcher()
    return kc.kernel_for_args(d, (1,), "cfg", (9, 0)), d


def test_a_cache_miss_loads_the_prebuilt_kernel_and_does_not_copy_it(prebuilt, tmp_path):
    before = kc.kernel_sources["prebuilt"]
    assert kc.prebuilt_status() is None
    kernel, d = _lookup()
    assert kernel == "prebuilt kernel" and d.compiles == 0
    assert kc.kernel_sources["prebuilt"] == before + 1
    assert not (tmp_path / "user").exists()


def test_the_user_cache_comes_first(prebuilt):
    path = kc.entry_path("cfg", ARGTYPES, (9, 0))
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps("cached kernel"))
    assert _lookup()[0] == "cached kernel"


@pytest.mark.parametrize("changes, reason", [
    ({"package_digest": "0" * 64}, "package_digest"),
    ({"numba_cuda": "0.1"}, "numba_cuda"),
    ({"linked_with_cuda": "14.0"}, "the driver is CUDA 13.0"),
    ({"linked_with_cuda": None}, f"no valid {kc.MANIFEST}"),
])
def test_a_manifest_that_does_not_match_compiles(prebuilt, changes, reason):
    write_manifest(prebuilt, **changes)
    assert reason in kc.prebuilt_status()
    kernel, d = _lookup()
    assert kernel == "compiled kernel" and d.compiles == 1
    assert kc.entry_path("cfg", ARGTYPES, (9, 0)).exists()  # and the user cache keeps it


@pytest.mark.parametrize("driver, used", [(12080, False), (None, False), (13000, True), (13050, True), (14000, True)])
def test_the_driver_must_be_of_the_linkers_cuda_major_version_or_newer(prebuilt, monkeypatch, driver, used):
    monkeypatch.setattr(kc, "_driver_cuda_version", lambda: driver)
    assert (kc.prebuilt_status() is None) == used
    assert _lookup()[1].compiles == (0 if used else 1)


def test_no_manifest_or_the_environment_turns_them_off(prebuilt, monkeypatch):
    monkeypatch.setenv("NUMBA_HOPPER_PREBUILT", "0")
    assert "NUMBA_HOPPER_PREBUILT=0" in kc.prebuilt_status()
    assert _lookup()[1].compiles == 1
    monkeypatch.delenv("NUMBA_HOPPER_PREBUILT")
    (prebuilt / kc.MANIFEST).unlink()
    assert kc.MANIFEST in kc.prebuilt_status()


def test_an_unloadable_prebuilt_entry_is_compiled(prebuilt, monkeypatch):
    def rejected(d, data):
        raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")

    monkeypatch.setattr(internals, "add_cubin_kernel", rejected)
    before = kc.kernel_sources["compiled"]
    kernel, d = _lookup()
    assert kernel == "compiled kernel" and d.compiles == 1
    assert kc.kernel_sources["compiled"] == before + 1


def test_a_kernel_missing_from_the_set_is_compiled(prebuilt):
    d = FakeDispatcher()
    assert kc.kernel_for_args(d, (1,), "another cfg", (9, 0)) == "compiled kernel" and d.compiles == 1
