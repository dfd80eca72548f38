"""gemm's array interop checks that run before a GPU is needed (CPU, stand-in arrays)."""

import numpy as np
import pytest

from numba_hopper import gemm
from test_arrays import FakeCupyArray


def test_operands_on_different_devices_are_refused():
    with pytest.raises(ValueError, match="device 0 and b on device 1"):
        gemm(FakeCupyArray((4, 8), "<f2", device=0), FakeCupyArray((8, 4), "<f2", device=1))


def test_out_on_another_device_is_refused():
    a, b = FakeCupyArray((4, 8), "<f2", device=0), FakeCupyArray((8, 4), "<f2", device=0)
    with pytest.raises(ValueError, match="out is on device 2"):
        gemm(a, b, out=FakeCupyArray((4, 4), "<f4", device=2))


@pytest.mark.parametrize("host", [np.zeros((4, 8), np.float16), [[0.0] * 8] * 4])
def test_host_operands_are_a_type_error_that_says_what_to_do(host):
    with pytest.raises(TypeError, match="host|not a CUDA device array"):
        gemm(host, FakeCupyArray((8, 4), "<f2"))
