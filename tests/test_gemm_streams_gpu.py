"""gemm runs on the caller's stream and never synchronizes the device."""

import pytest

from numba_hopper.gemm import gemm

pytestmark = pytest.mark.gpu


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
