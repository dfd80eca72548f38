"""The prebuilt kernels (CPU): the set the prebuilder finds, the entries it writes, and when
the kernel cache loads them."""

import json
import pickle
import pickletools
import types

import pytest

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
    """``(the kernel set, the cases refused)`` of the bf16 shape walk: one walk for the module."""
    refused = []
    return prebuild.kernel_set(("bf16",), refused=refused), refused


@pytest.fixture(scope="module")
def bf16_set(bf16_walk):
    return bf16_walk[0]


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
    assert configs and set(configs) <= bf16_set, configs


@pytest.mark.parametrize("batch, M, N, K", [(8, 512, 512, 512), (64, 128, 1024, 1024), (3, 4096, 4096, 4096)])
def test_the_set_holds_what_bmm_plans(batch, M, N, K, bf16_set, h100):
    a, b, out = _view(M, K), _view(K, N), _view(M, N)
    plan = _plan.bmm_plan(a, b, out, batch, (M * K, K * N, M * N), None)
    assert {spec.cfg for spec in plan.specs} <= bf16_set


def test_the_heuristics_plan_every_shape_of_the_walk(bf16_walk):
    """No shape of the walk is refused (batched 64-row tiles were once given a cluster they cannot run)."""
    assert bf16_walk[1] == []


def test_the_set_is_plain_kernels_of_16_bit_inputs(bf16_set):
    assert 10 < len(bf16_set) < 150
    assert all(c.epilogue is None and not c.debug and not c.stream_k for c in bf16_set)
    assert {(c.in_dtype, c.out_dtype) for c in bf16_set} == {("bf16", "bf16"), ("bf16", "f32")}
    assert {(c.a_major, c.b_major) for c in bf16_set} == {("K", "K"), ("K", "N"), ("M", "K"), ("M", "N")}


# --- one real build: its entry is what a launch looks up --------------------------------


def _smallest(configs):
    """The quickest kernel of the set to compile (few stages, small tile), K-major A, N-major B."""
    return min((c for c in configs if (c.a_major, c.b_major, c.out_dtype) == ("K", "N", "bf16")),
               key=lambda c: (c.block_m * c.block_n, c.stages))


@pytest.fixture(scope="module")
def built(bf16_set, tmp_path_factory):
    cfg = _smallest(bf16_set)
    out = tmp_path_factory.mktemp("prebuilt") / "set"
    manifest = prebuild.build(out, [cfg], jobs=1)
    return cfg, out, manifest


def _launch_lookup(cfg, monkeypatch):
    """``(cache key, argument types)`` of the launch ``_Gemm.prepare`` makes for ``cfg``."""

    class Prepared(Exception):
        pass

    def prepare_launch(kernel, grid, block, args, cache_key=None, **kw):
        raise Prepared(cache_key, internals.arg_types(kernel, args))

    monkeypatch.setattr(_plan, "device_limits", lambda device=0: prebuild.H100)
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    monkeypatch.setattr(_plan, "encode_template", lambda *a, **kw: types.SimpleNamespace(words=(0,) * 16))  # (driver)
    M, N, K = 256, 512, 1024
    operands = [_plan.Operand(v, _plan.Src(i)) for v, i in
                ((_view(M, K), _plan.A), (_view(K, N), _plan.B), (_view(M, N), _plan.OUT))]
    gemm = _plan._Gemm(cfg, *operands, _plan._Batch(), _plan._Scratch())
    with pytest.raises(Prepared) as launched:
        gemm.prepare([BASE, BASE, BASE + 2 * M * K, BASE + 2 * (M * K + K * N)])
    return launched.value.args


def test_the_entry_is_named_as_the_launch_looks_it_up(built, monkeypatch, tmp_path):
    cfg, out, manifest = built
    monkeypatch.setenv("NUMBA_HOPPER_CACHE_DIR", str(tmp_path))
    key, argtypes = _launch_lookup(cfg, monkeypatch)
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
