"""Fast float32 math without a whole-kernel ``fastmath=True``: one PTX instruction each, save
``ex2_fma`` (a short sequence).

numba compiles ``math.exp2(x)`` on a float32 to ``ex2.approx.f32``, which ptxas expands into
a range test, two multiplies and a ``MUFU.EX2`` to keep denormal results; ``1 / x`` to
``rcp.rn.f32``, a subroutine of some twenty instructions. ``@cuda.jit(fastmath=True)``
shortens both, but it also lets LLVM assume that no value is infinite or NaN, so a running
maximum that starts at ``-inf`` (softmax, attention) has undefined results. These intrinsics
give the short forms where they are asked for and nowhere else:

=========================  ==========================  ===================================
intrinsic                  PTX                         SASS, semantics
=========================  ==========================  ===================================
``ex2_approx_ftz(x)``      ``ex2.approx.ftz.f32``      one ``MUFU.EX2``; ``2**x`` to about
                                                       22 bits, denormal results flushed
                                                       to +0; ``ex2(-inf) = +0``
``ex2_approx(x)``          ``ex2.approx.f32``          ``MUFU.EX2`` plus the denormal path
``ex2_fma(x)``             ``add.rm``, ``fma`` ...     ``2**x`` without the MUFU: a cubic
                                                       on the FMA pipe, relative error
                                                       < 9e-5, for ``x <= 0``
``rcp_approx_ftz(x)``      ``rcp.approx.ftz.f32``      one ``MUFU.RCP``; ``1/x``, max
                                                       error 1 ulp; ``1/0 = +inf``
``rcp_approx(x)``          ``rcp.approx.f32``          ``MUFU.RCP`` plus the denormal path
``rsqrt_approx(x)``        ``rsqrt.approx.f32``        ``MUFU.RSQ`` plus the denormal path;
                                                       ``1/sqrt(x)``, max error 2 ulp (the
                                                       instruction of CUDA's ``rsqrtf``,
                                                       so of ``torch.rsqrt``)
``lg2_approx_ftz(x)``      ``lg2.approx.ftz.f32``      one ``MUFU.LG2``; ``log2(x)``,
                                                       ``lg2(0) = -inf``
``fmax(a, b)``             ``max.f32``                 one ``FMNMX``; a NaN operand is
                                                       ignored (the other is returned)
``fmin(a, b)``             ``min.f32``                 one ``FMNMX``, likewise
``fmax_nan(a, b)``         ``max.NaN.f32``             one ``FMNMX.NAN``; NaN if either is
``byte_perm(a, b, sel)``   ``prmt.b32``                one ``PRMT``: bytes of ``{b, a}``
                                                       picked by the nibbles of ``sel``
=========================  ==========================  ===================================

``e**x`` is ``ex2_approx_ftz(x * LOG2E)`` (``LOG2E = 1.4426950408889634``): fold ``LOG2E``
into the scale that multiplies ``x`` anyway (the softmax scale), so the exponential costs
one FFMA and one MUFU.EX2. PTX ISA 9.7.3 "Floating-Point Instructions".
"""

from ._ptx import b32, f32, ptx_asm, u32

__all__ = [
    "ex2_approx",
    "ex2_approx_ftz",
    "ex2_fma",
    "rcp_approx",
    "rcp_approx_ftz",
    "rsqrt_approx",
    "lg2_approx_ftz",
    "fmax",
    "fmin",
    "fmax_nan",
    "byte_perm",
]


@ptx_asm("ex2.approx.f32 {out}, {x};", pure=True)
def ex2_approx(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: ex2: ``2**x``, approximate, denormal results
    kept (MUFU.EX2 and a range fix-up)."""


@ptx_asm("ex2.approx.ftz.f32 {out}, {x};", pure=True)
def ex2_approx_ftz(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: ex2: ``2**x`` in one MUFU.EX2, denormals
    flushed to zero; ``ex2_approx_ftz(-inf) = +0``, ``ex2_approx_ftz(+inf) = +inf``."""


# 2**f on [0, 1): 1 + f (C1 + f (C2 + f C3)), minimax in relative error (8.6e-5), and
# p(0) = 1 exactly, p(1-) < 2, so the result's exponent is always the integer part's.
_EX2_C1, _EX2_C2, _EX2_C3 = "0f3F31F323", "0f3E691C73", "0f3D9DD415"


@ptx_asm(
    "{ .reg .f32 x, t, j, p; .reg .b32 ti, pi;"
    " max.f32 x, {x}, 0fC2FE0000;"  # -127: 2**-127 comes out as +0 (below)
    " add.rm.f32 t, x, 0f4B400000;"  # 1.5 * 2**23: t's low bits hold floor(x)
    " sub.f32 j, t, 0f4B400000;"
    " sub.f32 x, x, j;"  # the fraction, in [0, 1)
    f" fma.rn.f32 p, x, {_EX2_C3}, {_EX2_C2};"
    f" fma.rn.f32 p, p, x, {_EX2_C1};"
    " fma.rn.f32 p, p, x, 0f3F800000;"
    " mov.b32 ti, t; mov.b32 pi, p; shl.b32 ti, ti, 23; add.s32 pi, pi, ti;"  # exponent += floor(x)
    " mov.b32 {out}, pi; }",
    pure=True)
def ex2_fma(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions (max, add.rm, sub, fma) and 9.7.1 / 9.7.8
    (add, shl): ``2**x`` for ``x <= 0`` without the MUFU (FlashAttention-4's software
    exponential). The integer part goes into the exponent, the fraction through a cubic on the
    FMA pipe: relative error below 9e-5 (a bf16 or f16 result rounds by more); ``x <= -127``
    gives +0, so ``ex2_fma(-inf) = +0``. About eight SASS instructions where
    :func:`ex2_approx_ftz` is one MUFU.EX2: it pays only where the MUFU is busy and the warp
    has issue slots to spare (``kit.fragments.make_exp2_rows`` takes a share of a fragment's
    exponentials here)."""


@ptx_asm("rcp.approx.f32 {out}, {x};", pure=True)
def rcp_approx(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: rcp.approx: ``1/x`` within 1 ulp, denormals
    kept."""


@ptx_asm("rcp.approx.ftz.f32 {out}, {x};", pure=True)
def rcp_approx_ftz(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: rcp.approx: ``1/x`` in one MUFU.RCP,
    denormals flushed to zero; ``rcp_approx_ftz(0) = +inf``."""


@ptx_asm("rsqrt.approx.f32 {out}, {x};", pure=True)
def rsqrt_approx(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: rsqrt.approx: ``1/sqrt(x)`` within 2 ulp,
    denormals kept; ``rsqrt_approx(0) = +inf``."""


@ptx_asm("lg2.approx.ftz.f32 {out}, {x};", pure=True)
def lg2_approx_ftz(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: lg2: ``log2(x)`` in one MUFU.LG2, denormal
    inputs flushed to zero; ``lg2_approx_ftz(0) = -inf``."""


@ptx_asm("max.f32 {out}, {a}, {b};", pure=True)
def fmax(a: f32, b: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: max: the larger of ``a`` and ``b`` (one
    FMNMX); if one is NaN, the other. Exact for infinities: ``fmax(-inf, x) = x``."""


@ptx_asm("min.f32 {out}, {a}, {b};", pure=True)
def fmin(a: f32, b: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: min: the smaller of ``a`` and ``b`` (one
    FMNMX); if one is NaN, the other."""


@ptx_asm("max.NaN.f32 {out}, {a}, {b};", pure=True)
def fmax_nan(a: f32, b: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: max.NaN: the larger of ``a`` and ``b``, NaN
    if either is NaN (a NaN in a row reaches its maximum instead of vanishing)."""


@ptx_asm("prmt.b32 {out}, {a}, {b}, {selector};", pure=True)
def byte_perm(a: b32, b: b32, selector: u32) -> u32:
    """PTX ISA 9.7.9 Data Movement and Conversion Instructions: prmt: byte ``i`` of the result
    is byte ``(selector >> 4i) & 7`` of the eight bytes ``{b, a}`` (``a``'s are 0-3, ``b``'s
    4-7). ``0x5410``: the low halves of ``a`` then ``b``; ``0x7632``: their high halves."""
