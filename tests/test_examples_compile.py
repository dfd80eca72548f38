"""Every example's kernel still compiles for sm_90a to the instructions it teaches (CPU)."""

import pathlib
import runpy

import pytest

from numba_hopper.sass import inspect_kernel

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

# example file, kernel name, signature, SASS opcodes it must contain
KERNELS = [
    ("01_tma_copy.py", "tma_copy", "void(int64, int64, int64)", ("UTMALDG", "UTMASTG", "SYNCS")),
    ("02_wgmma_tile.py", "wgmma_tile", "void(int64, int64, float32[:, ::1])", ("UTMALDG", "HGMMA")),
    ("03_pipeline.py", "row_sums", "void(int64, int64, float32[::1])", ("UTMALDG", "SYNCS", "ELECT")),
    ("04_cluster_multicast.py", "multicast_tile", "void(int64, float32[:, :, ::1])", ("UTMALDG", "UCGABAR_WAIT")),
]


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(k[0] for k in KERNELS)


@pytest.mark.parametrize("filename, name, signature, opcodes", KERNELS, ids=[k[0] for k in KERNELS])
def test_example_kernel_compiles(filename, name, signature, opcodes):
    kernel = runpy.run_path(str(EXAMPLES / filename))[name]  # not __main__: nothing runs
    report = inspect_kernel(kernel, signature)
    for op in opcodes:
        assert report.count(op) >= 1, f"{op} missing: {report.summary()}"
    assert report.spill_bytes == 0, report.summary()
