"""The GEMM at small and ragged sizes in every layout, for compute-sanitizer (sanitize.sh).

Exits 1 if a result is wrong. Inputs and outputs are fully written before the GEMM runs,
so initcheck sees only the GEMM's own reads.
"""

import sys

import torch

from numba_hopper import gemm

SHAPES = [(64, 64, 64), (129, 257, 77), (1000, 7, 300)]


def operand(rows, cols, major):
    x = torch.randn(rows, cols, device="cuda") if major == "R" else torch.randn(cols, rows, device="cuda").t()
    return x.to(torch.bfloat16)


def main():
    bad = 0
    for M, N, K in SHAPES:
        for layout in ("RR", "RC", "CR", "CC"):
            a, b = operand(M, K, layout[0]), operand(K, N, layout[1])
            out = torch.full((M, N), float("nan"), device="cuda")
            gemm(a, b, out=out)
            ref = a.double() @ b.double()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            ok = err < 1e-4
            bad += not ok
            print(f"{M}x{N}x{K} {layout}: rel err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    torch.cuda.synchronize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
