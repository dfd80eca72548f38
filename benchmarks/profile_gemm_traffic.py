"""GEMM kernels for Nsight Compute: each contender called once in a profiled range, in order.

    ncu --clock-control none --profile-from-start off --csv \\
        --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_sectors_op_read.sum \\
        python benchmarks/profile_gemm_traffic.py 151936x2560x8192:CR=cublas,sustained,2x1-g2

Each argument is ``MxNxK:LAYOUT=CONTENDERS`` (bf16 operands as ``bench_gemm.py`` makes them):
``cublas`` (``torch.matmul``) or a ``bench_gemm.py --configs`` name (``default``,
``sustained``, ``2x1``, ``m192-n192``, ...), each into the same ``out=``. Every contender runs
twice first (compiled, operands resident), then once more between
``cudaProfilerStart``/``cudaProfilerStop``, synchronized, so ``ncu --profile-from-start off``
profiles one launch per contender, in the order ``ORDER`` prints. ``--clock-control none``
leaves the card's clocks as they are.

What it shows: the bytes a product reads from DRAM and from the L2. At the power limit a
kernel's clock falls with the energy it spends, and those reads are where two kernels of equal
work spend different energy (docs/performance.md, "Sustained load").
"""

import sys
import pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_gemm import _config, _operand, _parse_shape  # noqa: E402

import numba_hopper  # noqa: E402


def contenders(args):
    """``[(shape, name, call)]`` for the command line's ``SHAPE=NAME,NAME`` arguments."""
    calls = []
    for arg in args:
        shape, _, names = arg.partition("=")
        _, M, N, K, dtype, layout = _parse_shape(shape)
        a, b = _operand(M, K, dtype, layout[0]), _operand(K, N, dtype, layout[1])
        out = torch.empty(M, N, device="cuda", dtype=a.dtype)
        for name in names.split(","):
            if name == "cublas":
                calls.append((shape, name, lambda a=a, b=b, out=out: torch.matmul(a, b, out=out)))
            else:
                cfg = _config(name, layout)
                calls.append((shape, name, lambda a=a, b=b, out=out, cfg=cfg: numba_hopper.gemm(a, b, out=out, config=cfg)))
    return calls


def main(argv):
    if not argv:
        sys.exit(__doc__)
    calls = contenders(argv)
    for _, _, call in calls:
        call()
        call()
    torch.cuda.synchronize()
    print("ORDER", [(shape, name) for shape, name, _ in calls])
    torch.cuda.cudart().cudaProfilerStart()
    for _, _, call in calls:
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
