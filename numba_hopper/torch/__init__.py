"""numba_hopper for PyTorch: custom ops, autograd, and torch's matmul semantics.

    import numba_hopper.torch as nht
    y = nht.linear(x, weight, bias, activation="gelu_tanh")   # differentiable, one kernel
    nht.replace_linear(model)                                 # every nn.Linear, in place
    nht.fuse_gated_mlps(model)                                # SwiGLU MLPs on one gated GEMM
    nht.fuse_linear_cross_entropy(model)                      # the LM loss without fp32 logits
    nht.fuse_rms_norms(model)                                 # RMSNorm in one kernel each way
    opt = nht.AdamW(model.parameters(), lr=1e-5)              # one kernel a step (16-bit params)
    model = torch.compile(model, fullgraph=True)              # no graph break

- :mod:`~numba_hopper.torch.ops`: the ``torch.library`` custom ops ``numba_hopper::gemm``,
  ``numba_hopper::gemm_aux`` and ``numba_hopper::bmm``, with fake implementations (for
  ``torch.compile`` and ``torch.export``) and autograd formulas (and ``gemm_no_grad``, ``mm``,
  ``bmm_no_grad`` without: what graphs traced under ``torch.no_grad()`` call);
- :mod:`~numba_hopper.torch.functional`: ``mm``, ``addmm``, ``bmm``, ``baddbmm`` and
  ``matmul``, with PyTorch's semantics (broadcasting, 1-D operands, ``beta``/``alpha``,
  K == 0);
- :mod:`~numba_hopper.torch.linear`: ``linear``, the ``nn.Linear`` drop-in ``Linear``, and
  ``replace_linear``;
- :mod:`~numba_hopper.torch.mlp`: ``GatedMLP`` and ``fuse_gated_mlps``, SwiGLU MLPs whose gate and
  up products are one gated GEMM in inference (``torch.compile`` finds them by itself: ``_post_grad``).
- :mod:`~numba_hopper.torch.attention`: the ``numba_hopper::attention`` op,
  ``scaled_dot_product_attention`` (SDPA's drop-in) and ``register_transformers_attention``
  (``attn_implementation="numba_hopper"``).
- :mod:`~numba_hopper.torch.loss`: ``linear_cross_entropy`` (a language model's head and its
  loss without float32 logits) and ``fuse_linear_cross_entropy`` (a transformers causal LM's
  training loss on it).
- :mod:`~numba_hopper.torch.norm`: ``rms_norm``, ``RMSNorm`` and ``fuse_rms_norms`` (transformers'
  RMSNorm in one kernel forward and one backward).
- :mod:`~numba_hopper.torch.optim`: ``AdamW``, ``torch.optim.AdamW`` for 16-bit CUDA parameters
  in one bandwidth-bound kernel a step.

Everything runs on PyTorch's current stream and never synchronizes, so ``torch.cuda.graph``
captures it (after a warm-up call, which compiles). bf16/fp16 CUDA tensors on a Hopper GPU;
anything else raises before launch (``numba_hopper.errors``). Importing this module imports
torch; ``import numba_hopper`` alone does not.
"""

try:
    import torch  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "torch":  # torch is there but broken: its own error says more
        raise
    raise ImportError("numba_hopper.torch needs PyTorch: pip install 'numba-hopper[torch]' "
                      "(from a clone of the repository: pip install -e '.[torch]')") from exc

from . import _embedding_grad, ops  # noqa: F401  (register the custom ops)
from .functional import addmm, baddbmm, bmm, matmul, mm
from .linear import Linear, linear, replace_linear
from .mlp import GatedMLP, fuse_gated_mlps
from .attention import register_transformers_attention, scaled_dot_product_attention
from .loss import fuse_linear_cross_entropy, linear_cross_entropy
from .norm import RMSNorm, fuse_rms_norms, rms_norm
from .optim import AdamW

__all__ = ["ops", "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "Linear", "replace_linear", "GatedMLP",
           "fuse_gated_mlps", "scaled_dot_product_attention", "register_transformers_attention",
           "linear_cross_entropy", "fuse_linear_cross_entropy", "rms_norm", "RMSNorm", "fuse_rms_norms", "AdamW"]
