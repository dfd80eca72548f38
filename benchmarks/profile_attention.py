"""One attention call for a profiler: ours or an SDPA backend, at one of bench_attention.py's points.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats --print-details all \\
        python benchmarks/profile_attention.py --head-dim 64 --seqlen 2048 --causal
    ncu --clock-control none --profile-from-start off --section SourceCounters \\
        --page source --print-source sass --csv \\
        python benchmarks/profile_attention.py --head-dim 64 --seqlen 2048 --causal > sass.csv

The call runs three times to compile and warm up, then once between ``cudaProfilerStart`` and
``cudaProfilerStop``, so ``--profile-from-start off`` profiles that call's kernels alone (the
clocks left alone: ``--clock-control none``). The point is bench_attention.py's: 16384 tokens a
batch, the head count of the head dim, bf16. ``--backend cudnn`` (or ``flash``, ``efficient``)
profiles torch's SDPA backend instead, for the same reading of the fastest reference;
``--config`` (bench_attention.py's ``--configs`` syntax) another kernel configuration than the tuned one.
"""

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_attention import HEADS, TOKENS, parse_config  # noqa: E402

import numba_hopper  # noqa: E402

BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dim", type=int, choices=tuple(HEADS), default=64)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--backend", choices=("ours", *BACKENDS), default="ours")
    p.add_argument("--config", metavar="FIELD=VALUE,...", help="ours: this AttentionConfig instead of the tuned one")
    args = p.parse_args(argv)
    config = parse_config(args.config, args.head_dim) if args.config else None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads = HEADS[args.head_dim]
    q, k, v = (torch.randn(TOKENS // args.seqlen, heads, args.seqlen, args.head_dim, device="cuda",
                           dtype=torch.bfloat16) for _ in range(3))

    def call():
        if args.backend == "ours":
            return numba_hopper.attention(q, k, v, causal=args.causal, config=config)
        with sdpa_kernel(getattr(SDPBackend, BACKENDS[args.backend])):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
