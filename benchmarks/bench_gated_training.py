"""The fused training MLP's kernels (``fuse_gated_mlps(fused_training=True)``) against the
unfused path's, same process.

    python benchmarks/bench_gated_training.py [--rounds 11] [--out out.json]   # default: results/gated-training-<gpu>.json

Each pair computes the same tensors at the MLPs of Llama with hidden 2048 (width 5632), Qwen3-4B
(2560, 9728) and Llama-3-8B (4096, 14336), 8192 tokens, bf16, fresh outputs:

- forward: ``gemm(x, w_gate.t(), up=w_up.t(), activation="silu", aux_out=pre)`` (the gated
  output and both products) against two GEMMs and ``torch.compile``'s SiLU-and-multiply (what
  a compiled step with the three linears runs);
- backward: ``gemm_glu_backward(dy, w_down, gate, up)`` (the gradients of both products, the
  derivative in the epilogue) against the GEMM ``dy @ w_down`` and ``torch.compile``'s
  SiLU-and-multiply derivative.

``ratio = unfused_ms / fused_ms`` is the median of interleaved rounds' paired ratios (CUDA events,
``bench_gemm.py``'s method); each side is checked against float64 first.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_gemm import interleaved_rounds, medians, paired_ratio, print_table, save_results  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from numba_hopper import gemm, gemm_glu_backward  # noqa: E402

MLPS = [("llama-2048", 2048, 5632), ("qwen3-4b", 2560, 9728), ("llama-3-8b", 4096, 14336)]
TOKENS = 8192


def fused_forward(x, wg, wu, wd, dy, gate, up):
    pre = x.new_empty((x.shape[0], 2 * wg.shape[0]))
    return gemm(x, wg.t(), up=wu.t(), activation="silu", aux_out=pre), pre[:, :wg.shape[0]], pre[:, wg.shape[0]:]


def unfused_forward(silu_mul):
    def run(x, wg, wu, wd, dy, gate, up):
        g, u = gemm(x, wg.t()), gemm(x, wu.t())
        return silu_mul(g, u), g, u
    return run


def fused_backward(x, wg, wu, wd, dy, gate, up):
    return gemm_glu_backward(dy, wd, gate, up)


def unfused_backward(derivative):
    def run(x, wg, wu, wd, dy, gate, up):
        return derivative(gemm(dy, wd), gate, up)
    return run


def _silu_mul(g, u):
    return F.silu(g) * u


def _derivative(dh, g, u):
    dh, g32 = dh.float(), g.float()
    s = torch.sigmoid(g32)
    return (dh * u.float() * s * (1 + g32 * (1 - s))).to(g.dtype), (dh * g32 * s).to(g.dtype)


def _references(x, wg, wu, wd, dy, gate, up):
    xd, gd, ud = x.double(), gate.double(), up.double()
    g, u = xd @ wg.double().t(), xd @ wu.double().t()
    dh, s = dy.double() @ wd.double(), torch.sigmoid(gd)
    return {"forward": (F.silu(g) * u, g, u), "backward": (dh * ud * s * (1 + gd * (1 - s)), dh * gd * s)}


def bench(hidden, width, rounds, l2_bytes, compiled):
    bf = torch.bfloat16
    weights = [torch.randn(width, hidden, device="cuda", dtype=bf) / hidden ** 0.5 for _ in range(2)]
    weights.append(torch.randn(hidden, width, device="cuda", dtype=bf) / width ** 0.5)
    per_set = 2 * TOKENS * (2 * hidden + 2 * width)
    sets = [(torch.randn(TOKENS, hidden, device="cuda", dtype=bf), *weights,
             torch.randn(TOKENS, hidden, device="cuda", dtype=bf),
             *(torch.randn(TOKENS, width, device="cuda", dtype=bf) for _ in range(2)))
            for _ in range(max(2, -(-2 * l2_bytes // per_set) + 1))]
    refs = _references(*sets[0])
    records = []
    for step, fused, unfused in (("forward", fused_forward, unfused_forward(compiled["silu_mul"])),
                                 ("backward", fused_backward, unfused_backward(compiled["derivative"]))):
        errors = {}
        for name, fn in (("fused", fused), ("unfused", unfused)):
            got = fn(*sets[0])
            errors[name] = max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, refs[step]))
            if not errors[name] < 1e-2:
                raise AssertionError(f"{name} {step}: relative error {errors[name]}")
        times = interleaved_rounds({"fused": fused, "unfused": unfused}, sets, rounds, "unfused")
        med = medians(times)
        records.append({"step": step, "fused_ms": med["fused"], "unfused_ms": med["unfused"],
                        "ratio": paired_ratio(times, "unfused", "fused"), "fused_error": errors["fused"],
                        "unfused_error": errors["unfused"]})
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/gated-training-<gpu>.json)")
    args = p.parse_args(argv)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    compiled = {"silu_mul": torch.compile(_silu_mul), "derivative": torch.compile(_derivative)}
    records = []
    for model, hidden, width in MLPS:
        for r in bench(hidden, width, args.rounds, l2, compiled):
            records.append({"name": f"{model} {r['step']}", "model": model, "tokens": TOKENS, "hidden": hidden,
                            "width": width, **r})
            print(records[-1], flush=True)
    out = save_results("gated-training", {"tokens": TOKENS, "records": records}, args.out)
    print_table(records, [("name", "case", "s"), ("fused_ms", "fused ms", ".3f"), ("unfused_ms", "unfused ms", ".3f"),
                          ("ratio", "unfused / fused", ".3f")], out)


if __name__ == "__main__":
    main()
