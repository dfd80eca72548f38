"""Scratch taken and given back in stream order (runtime/workspace.py), with the driver faked.

The fake records each driver call in order; what the real driver does with them (reuse only
after a free has completed in stream order) is tests/test_workspace_gpu.py's part.
"""

import threading

import pytest
from cuda.bindings import driver

import numba_hopper
from numba_hopper.errors import DeviceOutOfMemoryError, NumbaHopperError
from numba_hopper.matmul import plan as _plan
from numba_hopper.runtime import workspace
from numba_hopper.runtime.workspace import CLAIMS_BYTES, KEEP_BYTES, alloc_scratch, free_scratch, scratch_pool_bytes

OK, OOM = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
ATTR = driver.CUmemPool_attribute


class FakeDriver:
    """The driver calls workspace makes: each one logged as a tuple; allocations of more than
    ``capacity`` bytes fail with CUDA_ERROR_OUT_OF_MEMORY, calls named in ``fail`` with
    CUDA_ERROR_INVALID_VALUE."""

    def __init__(self, capacity=1 << 40):
        self.capacity, self.fail, self.log = capacity, set(), []
        self.lock = threading.Lock()
        self.next_pool, self.next_ptr = 1, 0x7000_0000_0000

    def __getattr__(self, name):  # types and enums: the real module's
        return getattr(driver, name)

    def _result(self, name):
        return driver.CUresult.CUDA_ERROR_INVALID_VALUE if name in self.fail else OK

    def cuMemPoolCreate(self, props):
        with self.lock:
            pool, self.next_pool = self.next_pool, self.next_pool + 1
        self.log.append(("create", props.location.id, props.location.type, props.allocType, pool))
        return self._result("cuMemPoolCreate"), pool

    def cuMemPoolSetAttribute(self, pool, attr, value):
        self.log.append(("set", pool, attr, int(value)))
        return (self._result("cuMemPoolSetAttribute"),)

    def cuMemPoolGetAttribute(self, pool, attr):
        return OK, driver.cuuint64_t({ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: 6 << 20,
                                      ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT: 2 << 20}[attr])

    def cuMemAllocFromPoolAsync(self, nbytes, pool, stream):
        if nbytes > self.capacity:
            return OOM, 0
        with self.lock:
            ptr, self.next_ptr = self.next_ptr, self.next_ptr + (-(-nbytes // 4096) * 4096)
        self.log.append(("alloc", nbytes, pool, stream, ptr))
        return self._result("cuMemAllocFromPoolAsync"), ptr

    def cuMemsetD8Async(self, ptr, value, nbytes, stream):
        self.log.append(("memset", ptr, value, nbytes, stream))
        return (self._result("cuMemsetD8Async"),)

    def cuMemFreeAsync(self, ptr, stream):
        self.log.append(("free", ptr, stream))
        return (self._result("cuMemFreeAsync"),)


@pytest.fixture
def fake():
    fake = FakeDriver()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workspace, "driver", fake)
        mp.setattr(workspace, "_pools", {})
        yield fake


def _calls(fake, kind):
    return [entry for entry in fake.log if entry[0] == kind]


def test_the_first_use_makes_the_devices_pool_with_its_settings(fake):
    alloc_scratch(3, 7, 4096, zero_claims=False)
    (create,) = _calls(fake, "create")
    _, device, location, alloc_type, pool = create
    assert device == 3 and location == driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    assert alloc_type == driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    settings = {attr: value for _, p, attr, value in _calls(fake, "set") if p == pool}
    assert settings == {ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: KEEP_BYTES,
                        ATTR.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: 0}


def test_scratch_is_taken_and_given_back_on_the_calls_stream(fake):
    scratch = alloc_scratch(0, 7, 4096, zero_claims=False)
    ((_, nbytes, pool, stream, base),) = _calls(fake, "alloc")
    assert (nbytes, stream, scratch) == (CLAIMS_BYTES + 4096, 7, base + CLAIMS_BYTES)
    assert pool == _calls(fake, "create")[0][-1]
    assert not _calls(fake, "memset")  # no claims asked for: nothing queued but the allocation
    free_scratch(scratch, 7)
    assert fake.log[-1] == ("free", base, 7)


def test_claims_are_zeroed_in_stream_order_when_asked_for(fake):
    scratch = alloc_scratch(0, 9, 0, zero_claims=True)
    assert [e[0] for e in fake.log if e[0] in ("alloc", "memset")] == ["alloc", "memset"]
    assert _calls(fake, "memset") == [("memset", scratch - CLAIMS_BYTES, 0, CLAIMS_BYTES, 9)]


def test_one_pool_per_device_whatever_the_threads_and_streams(fake):
    start = threading.Barrier(8)

    def call(stream):
        start.wait()
        for _ in range(20):
            free_scratch(alloc_scratch(0, stream, 1000, zero_claims=False), stream)

    threads = [threading.Thread(target=call, args=(s,)) for s in range(100, 108)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alloc_scratch(1, 5, 1000, zero_claims=False)
    assert [e[1] for e in _calls(fake, "create")] == [0, 1]
    assert list(workspace._pools) == [0, 1]  # nothing kept per stream
    allocs, frees = _calls(fake, "alloc"), _calls(fake, "free")
    assert len(allocs) == 161 and len(frees) == 160
    assert sorted((ptr, stream) for *_, stream, ptr in allocs[:-1]) == sorted((ptr, s) for _, ptr, s in frees)


def test_out_of_memory_raises_a_memory_error_naming_the_bytes_and_queues_nothing(fake):
    fake.capacity = 1 << 30
    asked = CLAIMS_BYTES + (3 << 30)
    with pytest.raises(DeviceOutOfMemoryError, match=rf"device 2: a GEMM call's scratch needs {asked} bytes") as info:
        alloc_scratch(2, 7, 3 << 30, zero_claims=True)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, NumbaHopperError)
    assert (info.value.nbytes, info.value.device) == (asked, 2)
    assert not _calls(fake, "alloc") and not _calls(fake, "memset")
    scratch = alloc_scratch(2, 7, 4096, zero_claims=True)  # the next call works
    assert _calls(fake, "alloc")[0][-1] == scratch - CLAIMS_BYTES


def test_the_exception_is_exported_with_the_others():
    assert numba_hopper.DeviceOutOfMemoryError is DeviceOutOfMemoryError
    assert "DeviceOutOfMemoryError" in numba_hopper.__all__


@pytest.mark.parametrize("call", ["cuMemPoolCreate", "cuMemPoolSetAttribute", "cuMemAllocFromPoolAsync"])
def test_other_driver_errors_name_the_call(fake, call):
    fake.fail.add(call)
    with pytest.raises(RuntimeError, match=f"{call}.*failed: .*CUDA_ERROR_INVALID_VALUE"):
        alloc_scratch(0, 7, 4096, zero_claims=False)


def test_a_failed_claims_memset_gives_the_memory_back(fake):
    fake.fail.add("cuMemsetD8Async")
    with pytest.raises(RuntimeError, match="cuMemsetD8Async failed"):
        alloc_scratch(0, 7, 4096, zero_claims=True)
    ((*_, base),) = _calls(fake, "alloc")
    assert fake.log[-1] == ("free", base, 7)


def test_pool_bytes(fake):
    assert scratch_pool_bytes(0) == (0, 0)
    alloc_scratch(0, 7, 4096, zero_claims=False)
    assert scratch_pool_bytes(0) == (6 << 20, 2 << 20)


# --- Plan.__call__ ---------------------------------------------------------------------------


class _Step:
    """A plan step that logs the scratch address it is run with (or raises ``error``)."""

    def __init__(self, log, error=None):
        self.log, self.error = log, error

    def prepare(self, values):
        return self, ()

    def __call__(self, stream, values, binds):
        if self.error:
            raise self.error
        self.log.append(("step", values[_plan.SCRATCH], stream))


def _scratch_plan(fake, nbytes=4096, claims=False, error=None):
    scratch = _plan._Scratch()
    scratch.take(nbytes)
    if claims:
        scratch.claims()
    return _plan.Plan(0, [_Step(fake.log), _Step(fake.log, error)], scratch)


def test_each_call_takes_scratch_before_its_steps_and_gives_it_back_after(fake):
    plan = _scratch_plan(fake)
    for stream in (7, 7, 8):
        plan(stream, [0] * 20)
    kinds = [e[0] for e in fake.log if e[0] != "set" and e[0] != "create"]
    assert kinds == ["alloc", "step", "step", "free"] * 3  # a fresh region per call, none kept per stream
    for call in range(3):
        alloc, step, _, free = [e for e in fake.log if e[0] in ("alloc", "step", "free")][4 * call:4 * call + 4]
        stream, base = alloc[3], alloc[4]
        assert step == ("step", base + CLAIMS_BYTES, stream) and free == ("free", base, stream)
        assert alloc[1] == CLAIMS_BYTES + plan.scratch_bytes


def test_a_claiming_plan_zeroes_its_claims_before_its_steps(fake):
    plan = _scratch_plan(fake, nbytes=0, claims=True)
    plan(7, [0] * 20)
    kinds = [e[0] for e in fake.log if e[0] in ("alloc", "memset", "step", "free")]
    assert kinds == ["alloc", "memset", "step", "step", "free"]


def test_a_failing_step_still_gives_the_scratch_back(fake):
    plan = _scratch_plan(fake, error=RuntimeError("launch failed"))
    with pytest.raises(RuntimeError, match="launch failed"):
        plan(7, [0] * 20)
    ((*_, base),) = _calls(fake, "alloc")
    assert fake.log[-1] == ("free", base, 7)


def test_out_of_memory_leaves_the_plan_usable(fake):
    plan = _scratch_plan(fake, nbytes=1 << 20)
    fake.capacity = 1 << 19
    with pytest.raises(DeviceOutOfMemoryError):
        plan(7, [0] * 20)
    assert not [e for e in fake.log if e[0] in ("alloc", "step", "free")]
    fake.capacity = 1 << 30
    plan(7, [0] * 20)
    assert [e[0] for e in fake.log if e[0] in ("alloc", "step", "free")] == ["alloc", "step", "step", "free"]


def test_a_plan_without_scratch_calls_no_allocator(fake):
    plan = _plan.Plan(0, [_Step(fake.log)])
    plan(7, [0] * 20)
    assert [e[0] for e in fake.log] == ["step"]
