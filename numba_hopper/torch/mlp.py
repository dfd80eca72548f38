"""Gated MLPs (SwiGLU: ``down(silu(gate(x)) * up(x))``, as Llama, Mistral and Qwen2 define them) on one
gated GEMM: :class:`GatedMLP` and :func:`fuse_gated_mlps`.

In inference (no gradient needed) the gate and up products and the SiLU-and-multiply between them
are one kernel, ``numba_hopper.gemm(x, gate.weight.t(), up=up.weight.t(), activation="silu")``,
which writes only the gated output; eagerly, in a CUDA graph and traced. When a gradient is
needed the MLP runs its three linears as before (the gated kernel keeps neither product, which
the backward would need). ``torch.compile`` of an unfused MLP gets the same kernel from
Inductor's pass (``_post_grad``).
"""

from __future__ import annotations

import torch

from ..matmul import api as _matmul
from . import ops
from .linear import Linear

__all__ = ["GatedMLP", "fuse_gated_mlps"]


class GatedMLP(torch.nn.Module):
    """An MLP with Linear ``gate_proj``, ``up_proj`` (no bias) and ``down_proj``, and a SiLU ``act_fn``,
    run as one gated GEMM and the down projection. The same submodules, parameters and ``state_dict``
    keys as the module it is made from (:meth:`from_mlp`)."""

    def __init__(self, gate_proj, up_proj, down_proj, act_fn):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = gate_proj, up_proj, down_proj, act_fn

    @classmethod
    def from_mlp(cls, mlp):
        return cls(mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn).train(mlp.training)

    def forward(self, x):
        gate, up = self.gate_proj.weight, self.up_proj.weight
        if x.dim() < 2 or ops.needs_grad((x, gate, up)):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        if ops.tracing((x, gate, up)):
            gated = ops.gated_mm(x.flatten(0, -2), gate.t(), up.t(), "silu").view(*x.shape[:-1], gate.shape[0])
        else:  # (numba_hopper.gemm reads x's leading dimensions as rows)
            gated = _matmul.gemm(x, gate.t(), up=up.t(), activation="silu")
        return self.down_proj(gated)


# torch's, and transformers' for hidden_act="silu" (a module whose forward is F.silu)
_SILU_CLASSES = ("SiLU", "SiLUActivation")


def _is_gated_mlp(m):
    linears = [getattr(m, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return (not isinstance(m, GatedMLP) and all(isinstance(lin, torch.nn.Linear) for lin in linears)
            and linears[0].bias is None and linears[1].bias is None
            and linears[0].weight.shape == linears[1].weight.shape
            and type(getattr(m, "act_fn", None)).__name__ in _SILU_CLASSES)


def fuse_gated_mlps(model: torch.nn.Module) -> int:
    """Replace, in place, every SwiGLU MLP inside ``model`` (a module with ``gate_proj``,
    ``up_proj`` and ``down_proj`` Linears, the first two without bias, and a SiLU ``act_fn``:
    ``nn.SiLU`` or transformers' ``SiLUActivation``) by a :class:`GatedMLP` of the same submodules, its linears swapped for
    :class:`~numba_hopper.torch.Linear`; return how many."""
    fused = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_gated_mlp(child):
                for lin in ("gate_proj", "up_proj", "down_proj"):
                    if not isinstance(getattr(child, lin), Linear):
                        setattr(child, lin, Linear.from_linear(getattr(child, lin)))
                setattr(parent, name, GatedMLP.from_mlp(child))
                fused += 1
    return fused
