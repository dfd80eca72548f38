"""smem: shared addresses, dynamic shared memory, typed views, matrix descriptors (CPU)."""

import re

import numpy as np
import pytest
from numba import cuda

from numba_hopper.intrinsics import (
    dynamic_shared_base,
    ld_shared_u32,
    matrix_descriptor,
    matrix_descriptor_host,
    shared_address,
    shared_array,
    st_shared_u32,
)
from numba_hopper.tools.sass import inspect_kernel

EXTERN_1024 = re.compile(r"\.extern \.shared \.align 1024 \.b8 (\w+)\[\];")


@cuda.jit(launch_bounds=(128, 1))
def _address_kernel(out):
    s = cuda.shared.array(64, np.uint32, alignment=16)
    a = shared_address(s[4:])
    st_shared_u32(a + 4 * (cuda.threadIdx.x % 32), cuda.threadIdx.x)
    cuda.syncthreads()
    out[cuda.threadIdx.x] = ld_shared_u32(shared_address(s) + 4 * (cuda.threadIdx.x % 64))


def test_shared_address_is_a_shared_state_space_address():
    r = inspect_kernel(_address_kernel, "void(uint32[::1])")
    # Used as a .shared::cta address: shared loads/stores (STS/LDS), no generic ones.
    assert r.count("STS") == 1 and r.count("LDS") == 1
    assert r.count("ST") == 0 and r.count("LD") == 0
    assert "cvta" not in r.ptx.split("_address_kernel")[-1].replace("cvta.to.global", "")
    assert r.spill_bytes == 0


@cuda.jit(launch_bounds=(128, 1))
def _dynamic_kernel(out):
    static = cuda.shared.array(40, np.float32)  # 160 B of static shared memory first
    numba_dyn = cuda.shared.array(0, np.float32)  # numba's own extern array
    static[cuda.threadIdx.x % 40] = 1.0
    numba_dyn[cuda.threadIdx.x] = 2.0
    base = dynamic_shared_base()
    out[0] = base
    out[1] = dynamic_shared_base() + 16
    out[2] = shared_address(numba_dyn)
    out[3] = np.uint32(static[3])


def test_dynamic_shared_base_declares_one_1024_aligned_extern():
    r = inspect_kernel(_dynamic_kernel, "void(uint32[::1])")
    externs = EXTERN_1024.findall(r.ptx)
    assert externs == ["__numba_hopper_dynamic_smem"], r.ptx
    assert r.spill_bytes == 0


@cuda.jit(launch_bounds=(128, 1))
def _view_kernel(out, off):
    tile = shared_array(256, (4, 8), np.float32)
    tile[1, 2] = 3.0  # 256 + (1*8 + 2)*4 = 296
    words = shared_array(off, 16, np.uint32)  # run-time offset
    words[cuda.threadIdx.x % 16] = cuda.threadIdx.x
    cuda.syncthreads()
    out[0] = shared_address(tile)
    out[1] = np.uint32(tile[1, 2]) + words[3]
    out[2] = tile.shape[0] * 100 + tile.shape[1]


def test_shared_array_is_a_typed_view_of_dynamic_smem():
    r = inspect_kernel(_view_kernel, "void(uint32[::1], int32)")
    assert re.search(r"st\.shared\.[bfu]32\s+\[__numba_hopper_dynamic_smem\+296\]", r.ptx), r.ptx
    assert EXTERN_1024.search(r.ptx)
    assert r.count("STS") >= 2 and r.count("ST") == 0
    assert r.spill_bytes == 0


def test_shared_array_needs_constant_shape():
    @cuda.jit
    def bad(out, n):
        v = shared_array(0, n, np.float32)
        out[0] = v[0]

    with pytest.raises(Exception, match="shape must be a compile-time"):
        inspect_kernel(bad, "void(float32[::1], int32)")


# --- matrix descriptor -------------------------------------------------------------


def _by_hand(addr, lbo, sbo, swizzle_code, base):
    return (addr >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (base << 49) | (swizzle_code << 62)


@pytest.mark.parametrize(
    "args, expected",
    [
        # (start, LBO, SBO, swizzle bytes, base offset) -> hand-computed descriptor
        ((0, 0, 0, 0, 0), 0),
        ((1024, 16, 1024, 128, 0), 0x4000_0040_0001_0040),  # 128B: code 1 in bits 62-63
        ((0x400, 128, 256, 0, 0), 0x0000_0010_0008_0040),  # no swizzle, core-matrix strides
        ((16, 0, 0, 64, 0), 0x8000_0000_0000_0001),  # 64B: code 2
        ((16, 0, 0, 32, 0), 0xC000_0000_0000_0001),  # 32B: code 3
        ((0, 0, 0, 0, 7), 7 << 49),  # base offset in bits 49-51
        ((0x3FFF0, 0x3FFF0, 0x3FFF0, 0, 0), 0x0000_3FFF_3FFF_3FFF),  # every 14-bit field full
    ],
)
def test_matrix_descriptor_host_bits(args, expected):
    assert matrix_descriptor_host(*args) == expected
    code = {0: 0, 128: 1, 64: 2, 32: 3}[args[3]]
    assert expected == _by_hand(args[0], args[1], args[2], code, args[4])


def test_matrix_descriptor_host_checks_arguments():
    with pytest.raises(ValueError, match="swizzle_bytes"):
        matrix_descriptor_host(0, 16, 1024, 16, 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        matrix_descriptor_host(8, 16, 1024, 128, 0)
    with pytest.raises(ValueError, match="base_offset"):
        matrix_descriptor_host(0, 16, 1024, 128, 8)


@cuda.jit(launch_bounds=(128, 1))
def _desc_const_kernel(out):
    out[0] = matrix_descriptor(0x2400, 16, 1024, 128, 0)
    out[1] = matrix_descriptor(0x400, 128, 256, 0, 3)


@cuda.jit(launch_bounds=(128, 1))
def _desc_runtime_kernel(out, addr, swz):
    out[0] = matrix_descriptor(addr, 16, 1024, swz, 0)


def test_matrix_descriptor_device_folds_to_host_value():
    r = inspect_kernel(_desc_const_kernel, "void(uint64[::1])")
    body = r.ptx.split("_desc_const_kernel")[-1]
    for value in (matrix_descriptor_host(0x2400, 16, 1024, 128, 0), matrix_descriptor_host(0x400, 128, 256, 0, 3)):
        signed = value - (1 << 64) if value >= 1 << 63 else value  # PTX prints s64 immediates
        assert re.search(rf"\b{signed}\b", body), (value, body)


def test_matrix_descriptor_device_is_branch_free():
    r = inspect_kernel(_desc_runtime_kernel, "void(uint64[::1], uint32, uint32)")
    body = r.ptx.split("_desc_runtime_kernel")[-1]
    assert "bra" not in body and "selp" not in body
    assert r.count("BRA") <= 1  # the trailing self-loop ptxas adds after EXIT
