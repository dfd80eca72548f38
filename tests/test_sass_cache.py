"""The on-disk cache of inspect_kernel's reports (CPU): what it keys on, and that a hit is the
report a compile gave."""

import dataclasses
import types

import pytest
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.runtime import kernel_cache
from numba_hopper.tools import sass, sass_cache

SIG = "void(float32[::1])"
CC = sass.HOPPER_CC


def _fenced(value, launch_bounds=(128, 1)):
    """A kernel whose closure holds ``value``."""

    @cuda.jit(launch_bounds=launch_bounds)
    def kernel(x):
        nh.wgmma_fence()
        x[cuda.threadIdx.x] = value

    return kernel


def _key(kernel, signature=SIG, cc=CC):
    return sass_cache.entry_key(kernel, signature, cc)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty report cache; counts the compiles behind inspect_kernel."""
    monkeypatch.setenv(sass_cache.ENV, str(tmp_path))
    compiles = []
    compile_report = sass.compile_report

    def counted(kernel, signature, cc):
        compiles.append(kernel)
        return compile_report(kernel, signature, cc)

    monkeypatch.setattr(sass, "compile_report", counted)
    return tmp_path, compiles


def test_a_hit_is_the_compiled_report_and_compiles_nothing(cache):
    directory, compiles = cache
    compiled = sass.inspect_kernel(_fenced(1.0), SIG)
    again = sass.inspect_kernel(_fenced(1.0), SIG)  # a new dispatcher of the same kernel
    assert len(compiles) == 1 and len(list(directory.glob("*.report"))) == 1
    assert dataclasses.asdict(again) == dataclasses.asdict(compiled)
    assert again.count("WARPGROUP.ARRIVE") == 1 and again.cubin[:4] == b"\x7fELF" and again.registers > 0
    sass.inspect_kernel(_fenced(2.0), SIG)
    assert len(compiles) == 2


def test_an_unreadable_entry_is_compiled_again_and_overwritten(cache):
    directory, compiles = cache
    kernel = _fenced(3.0)
    entry = directory / f"{_key(kernel)}.report"
    entry.write_bytes(b"not a report")
    report = sass.inspect_kernel(kernel, SIG)
    assert len(compiles) == 1 and entry.read_bytes() != b"not a report"
    assert sass_cache.load(directory, _key(kernel))["sass"] == report.sass


def test_no_cache_without_the_variable(cache, monkeypatch):
    directory, compiles = cache
    monkeypatch.delenv(sass_cache.ENV)
    sass.inspect_kernel(_fenced(4.0), SIG)
    sass.inspect_kernel(_fenced(4.0), SIG)
    assert len(compiles) == 2 and not list(directory.iterdir())


def test_the_key_follows_the_package_sources(monkeypatch):
    kernel = _fenced(1.0)
    before = _key(kernel)
    monkeypatch.setattr(kernel_cache, "package_digest", lambda: "0" * 64)
    assert _key(kernel) != before


def test_the_key_follows_the_call(monkeypatch):
    kernel = _fenced(1.0)
    key = _key(kernel)
    assert _key(_fenced(1.0)) == key  # another dispatcher, the same kernel
    assert len({key, _key(kernel, "void(float32[:])"), _key(kernel, cc=(9, 0)), _key(_fenced(2.0)),
                _key(_fenced(1.0, launch_bounds=(256, 1)))}) == 5
    monkeypatch.setenv("NUMBA_OPT", "0")
    assert _key(kernel) != key
    monkeypatch.delenv("NUMBA_OPT")
    monkeypatch.setenv("NUMBA_HOPPER_DUMP", "sass")  # what is printed, not what is compiled
    assert _key(kernel) == key


def _with_helper(helper_body, scale=2.0):
    """A kernel calling a device function through a module global, as a test module's are."""
    namespace = {"cuda": cuda, "SCALE": scale}
    exec(f"def helper(v):\n    {helper_body}\n", namespace)
    namespace["helper"] = cuda.jit(device=True)(namespace["helper"])
    exec("def k(x):\n    x[0] = helper(x[0])\n", namespace)
    return cuda.jit(namespace["k"])


def test_the_key_follows_what_the_kernel_calls():
    key = _key(_with_helper("return v * SCALE"))
    assert _key(_with_helper("return v * SCALE")) == key
    assert _key(_with_helper("return v + SCALE")) != key  # the device function's code
    assert _key(_with_helper("return v * SCALE", scale=3.0)) != key  # a global it reads


def _through_a_module(helper_body):
    """A kernel calling ``helpers.helper``: a module of the user's, read through an attribute."""
    helpers = types.ModuleType("user_helpers")  # no file: only what the kernel reads of it identifies it
    exec(f"def helper(v):\n    {helper_body}\n", helpers.__dict__)
    helpers.helper = cuda.jit(device=True)(helpers.helper)
    namespace = {"helpers": helpers}
    exec("def k(x):\n    x[0] = helpers.helper(x[0])\n", namespace)
    return cuda.jit(namespace["k"])


def test_the_key_follows_what_the_kernel_reads_of_a_user_module():
    key = _key(_through_a_module("return v * 2"))
    assert _key(_through_a_module("return v * 2")) == key
    assert _key(_through_a_module("return v * 3")) != key


def test_a_kernel_without_a_stable_identity_is_compiled_every_time(cache, monkeypatch):
    directory, _ = cache
    opaque = object()

    @cuda.jit
    def kernel(x):
        if opaque is None:
            x[0] = 1

    with pytest.raises(sass_cache.Unkeyable, match="builtins.object"):
        _key(kernel)
    stub, compiles = sass.KernelReport("kernel", CC, "", b"", "", "", 0, 0, 0, 0, 0, opcodes={}), []
    monkeypatch.setattr(sass, "compile_report", lambda *args: compiles.append(args) or stub)
    assert sass.inspect_kernel(kernel, SIG) is stub and sass.inspect_kernel(kernel, SIG) is stub
    assert len(compiles) == 2 and not list(directory.iterdir())


def test_the_gemm_kernels_are_keyed_on_their_config():
    from numba_hopper import GemmConfig
    from numba_hopper.kernels import gemm_argument_types
    from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel

    def key(cfg):
        return sass_cache.entry_key(make_gemm_kernel(cfg), gemm_argument_types(cfg), CC)

    assert key(GemmConfig("bf16", "bf16", "K", "N")) == key(GemmConfig())
    assert key(GemmConfig(stages=3)) != key(GemmConfig())
