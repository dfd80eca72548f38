"""Shared helpers for GPU tests: fresh random data, poisoned outputs, float64 references."""

import numpy as np


def rel_error(out, ref):
    """||out - ref|| / ||ref|| in float64; NaN anywhere in ``out`` gives inf."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return np.inf
    denom = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (denom if denom else 1.0)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
