"""gemm runs on the caller's stream and never synchronizes the device."""

import pytest

from numba_hopper import gemm

pytestmark = [pytest.mark.gpu, pytest.mark.serial]


def test_default_is_torchs_current_stream_and_no_device_sync():
    torch = pytest.importorskip("torch")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out)  # compile and plan outside the measured part
    side = torch.cuda.Stream()
    gate = torch.cuda.Event()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        gate.record()
        gemm(a, b, out=out)  # must queue behind the sleep on `side`, not run at once
        done = torch.cuda.Event()
        done.record()
    # Had gemm synchronized the device (or used another stream) the sleep would be over.
    assert not gate.query(), "gemm waited for the device"
    assert not done.query()
    done.synchronize()
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_explicit_stream_argument():
    torch = pytest.importorskip("torch")
    a = torch.randn(300, 200, device="cuda", dtype=torch.float16)
    b = torch.randn(200, 100, device="cuda", dtype=torch.float16)
    out = torch.full((300, 100), float("nan"), device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    gemm(a, b, out=out, stream=s)
    s.synchronize()
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4


SLEEP_CYCLES = 500_000_000  # ~0.3 s of spinning at H100 clocks


def _new_stream(kind, torch):
    """A new stream of ``kind``: (what gemm is given, its CUstream handle, the owner to keep)."""
    if kind == "torch":
        s = torch.cuda.Stream()
        return s, s.cuda_stream, s
    if kind == "raw int":
        s = torch.cuda.Stream()
        return s.cuda_stream, s.cuda_stream, s
    if kind == "numba":
        from numba import cuda

        s = cuda.stream()
        return s, int(s.handle), s
    if kind == "cupy":
        cupy = pytest.importorskip("cupy")
        s = cupy.cuda.Stream(non_blocking=True)
        return s, s.ptr, s
    from cuda.core import Device

    s = Device().create_stream()
    return s, int(s.handle), s


@pytest.mark.parametrize("kind", ["torch", "raw int", "numba", "cupy", "cuda.core"])
def test_gemm_is_queued_behind_earlier_work_on_the_given_stream(kind):
    import time

    torch = pytest.importorskip("torch")
    a = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1024, 768, device="cuda", dtype=torch.float32)
    gemm(a, b, out=out)  # compile and plan first: the call below takes the steady-state path
    out.fill_(float("nan"))
    torch.cuda.synchronize()

    arg, handle, owner = _new_stream(kind, torch)
    assert handle != 0, "a test stream must not be the legacy default stream (it orders everything)"
    stream = torch.cuda.ExternalStream(handle)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
    gemm(a, b, out=out, stream=arg)
    done = torch.cuda.Event()
    done.record(stream)

    time.sleep(0.02)  # had gemm run on another stream, it would be finished by now
    peek = torch.cuda.Stream()  # does not wait for `stream`
    with torch.cuda.stream(peek):
        early = out.clone()
    peek.synchronize()
    assert not done.query(), "the event recorded after gemm completed before the sleep ended"
    assert torch.isnan(early).all(), "gemm wrote out before the work queued ahead of it finished"
    done.synchronize()
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4
    del owner
