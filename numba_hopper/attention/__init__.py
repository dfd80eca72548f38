"""Attention forward on Hopper: FlashAttention-3's design (warp-specialized, TMA, wgmma with P in
registers, persistent) built on :mod:`numba_hopper.kit`.

- :func:`attention` (:mod:`.api`): the call on PyTorch tensors, dense or packed batches;
- :mod:`.config`: the kernel's configuration per head dim, its shared memory and parameters;
- :mod:`.kernel`: the kernel (roles), with :mod:`.scheduler` (persistent tile order),
  :mod:`.mainloop` (TMA loads; S = Q K^T, softmax, O += P V), :mod:`.softmax` (the online
  softmax on fragments) and :mod:`.epilogue` (TMA store of O, log-sum-exp);
- :mod:`.checks`: the input checks.
"""

from .api import attention, clear_plans, precompile
from .config import AttentionConfig, attention_config, tuned_configs

__all__ = ["attention", "clear_plans", "precompile", "AttentionConfig", "attention_config", "tuned_configs"]
