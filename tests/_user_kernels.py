"""Kernels of a user's own file, for ``python -m numba_hopper inspect tests/_user_kernels.py:NAME``
(tests/test_cli.py). Importing this file with a GPU-less driver must not compile anything."""

import numpy as np
from numba import cuda

SCALE = np.float32(2.0)


@cuda.jit("void(float32[::1])")
def declared(x):
    """Declared with its signature: numba compiles this at decoration, for the current GPU."""
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= SCALE


@cuda.jit
def undeclared(x, n):
    i = cuda.grid(1)
    if i < n:
        x[i] += 1


@cuda.jit(device=True)
def twice(v):
    return v * 2


NOT_A_KERNEL = 3

if __name__ == "__main__":
    raise SystemExit("inspect imports this file as a module, it does not run it as a script")
