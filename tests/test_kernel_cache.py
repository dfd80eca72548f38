"""The on-disk kernel cache's bookkeeping (CPU): numba's compile and pickling are stubbed."""

import pickle

import pytest

from numba_hopper.runtime import kernel_cache as kc
from numba_hopper import _numba_internals as internals


class FakeDispatcher:
    """Counts compiles; holds overloads like a CUDADispatcher."""

    def __init__(self):
        self.overloads, self.compiles = {}, 0


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_HOPPER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NUMBA_HOPPER_PREBUILT", "0")  # the user cache alone (tests/test_prebuilt.py: both)

    def compile_(d, args):
        d.compiles += 1
        d.overloads[("int64",) * len(args)] = ("kernel", args)
        return d.overloads[("int64",) * len(args)]

    def add(d, data):
        kernel = pickle.loads(data)
        d.overloads[("int64",) * len(kernel[1])] = kernel
        return kernel

    monkeypatch.setattr(internals, "arg_types", lambda d, args: ("int64",) * len(args))
    monkeypatch.setattr(internals, "has_overload", lambda d, types: types in d.overloads)
    monkeypatch.setattr(internals, "kernel_for_args", lambda d, args: d.overloads.get(("int64",) * len(args)) or compile_(d, args))
    monkeypatch.setattr(internals, "serialize_kernel", pickle.dumps)
    monkeypatch.setattr(internals, "add_serialized_kernel", add)
    return tmp_path


def test_a_new_process_loads_instead_of_compiling(cache):
    first = FakeDispatcher()
    assert kc.kernel_for_args(first, (1, 2), "cfg", (9, 0)) == ("kernel", (1, 2))
    assert first.compiles == 1 and len(list(cache.glob("*.nbk"))) == 1
    second = FakeDispatcher()  # a new process: same key, empty dispatcher
    assert kc.kernel_for_args(second, (1, 2), "cfg", (9, 0)) == ("kernel", (1, 2))
    assert second.compiles == 0


def test_key_cc_and_argument_types_each_pick_their_own_entry(cache):
    base = kc.entry_path("cfg", ("int64",), (9, 0))
    assert base.parent == cache
    assert len({base, kc.entry_path("other", ("int64",), (9, 0)), kc.entry_path("cfg", ("int32",), (9, 0)),
                kc.entry_path("cfg", ("int64",), (10, 0))}) == 4


def test_an_unloadable_entry_is_recompiled_and_replaced(cache):
    d = FakeDispatcher()
    path = kc.entry_path("cfg", ("int64",), (9, 0))
    path.write_bytes(b"not a pickle")
    kc.kernel_for_args(d, (1,), "cfg", (9, 0))
    assert d.compiles == 1 and pickle.loads(path.read_bytes()) == ("kernel", (1,))


def test_a_compiled_overload_skips_the_disk(cache):
    d = FakeDispatcher()
    d.overloads[("int64",)] = "in memory"
    assert kc.kernel_for_args(d, (1,), "cfg", (9, 0)) == "in memory"
    assert not list(cache.iterdir())


def test_empty_directory_setting_turns_the_cache_off(cache, monkeypatch):
    monkeypatch.setenv("NUMBA_HOPPER_CACHE_DIR", "")
    assert kc.cache_dir() is None
    kc.kernel_for_args(FakeDispatcher(), (1,), "cfg", (9, 0))
    assert not list(cache.iterdir())


def test_default_directory_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBA_HOPPER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kc.cache_dir() == tmp_path / "numba_hopper"


def test_an_unwritable_directory_only_costs_the_write(cache, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBA_HOPPER_CACHE_DIR", str(blocker / "sub"))  # a file where a directory should be
    d = FakeDispatcher()
    assert kc.kernel_for_args(d, (1,), "cfg", (9, 0)) == ("kernel", (1,))
    assert d.compiles == 1
