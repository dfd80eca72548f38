"""Every example's kernel still compiles for sm_90a to the instructions it teaches (CPU).

The kernels and signatures are the examples' own ``KERNELS``: what ``--inspect`` compiles.
"""

import pathlib
import runpy

import pytest

from numba_hopper.tools.sass import inspect_kernel

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

# example file, SASS opcodes its kernel must contain
OPCODES = [
    ("01_tma_copy.py", ("UTMALDG", "UTMASTG", "SYNCS")),
    ("02_wgmma_tile.py", ("UTMALDG", "HGMMA")),
    ("03_pipeline.py", ("UTMALDG", "SYNCS", "ELECT")),
    ("04_cluster_multicast.py", ("UTMALDG", "UCGABAR_WAIT")),
    ("05_pipelined_gemm.py", ("UTMALDG", "HGMMA", "STSM", "UTMASTG")),
    ("06_warp_specialized_gemm.py", ("UTMALDG", "HGMMA", "USETMAXREG", "STSM", "UTMASTG")),
    ("07_persistent_gemm.py", ("UTMALDG", "HGMMA", "USETMAXREG", "STSM", "UTMASTG")),
    ("08_attention_tile.py", ("UTMALDG", "HGMMA", "MUFU.EX2", "F2FP.BF16", "SHFL.BFLY", "UTMASTG")),
]


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(k[0] for k in OPCODES)


@pytest.mark.parametrize("filename, opcodes", OPCODES, ids=[k[0] for k in OPCODES])
def test_example_kernel_compiles(filename, opcodes):
    (kernel, signature), = runpy.run_path(str(EXAMPLES / filename))["KERNELS"]  # not __main__: nothing runs
    report = inspect_kernel(kernel, signature)
    for op in opcodes:
        assert report.count(op) >= 1, f"{op} missing: {report.summary()}"
    assert report.spill_bytes == 0, report.summary()
    assert not report.warnings, report.summary()  # no wgmma serialization (C7513-C7515), no ignored setmaxnreg
