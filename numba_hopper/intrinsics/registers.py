"""Register-tuple helpers for wgmma accumulators and fragments.

numba lowers ``tup[i]`` with a run-time ``i`` to a switch over every element; inside an
epilogue loop over a 128-float accumulator that switch is too big for LLVM to unroll, so
the loop stays rolled with hundreds of branches. :func:`tuple_as_array` instead copies the
tuple once into a thread-local array; indexing that array in loops with constant trip
counts unrolls, every index becomes a constant, and the array is promoted back to
registers (no local memory: check ``report.stack_frame == 0``). A run-time index that
survives unrolling would put it in local memory, which the inspection report shows.
"""

from llvmlite import ir
from numba.cuda import types

from ._ptx import intrinsic

__all__ = ["tuple_as_array"]


@intrinsic
def tuple_as_array(typingctx, tup):
    """A 1-D thread-local array holding the elements of the homogeneous tuple ``tup``."""
    if not isinstance(tup, types.UniTuple):
        return None
    arrty = types.Array(tup.dtype, 1, "C")

    def codegen(context, builder, sig, args):
        (value,) = args
        n = len(sig.args[0])
        elem_ty = context.get_data_type(tup.dtype)
        # The stack slot goes in the entry block, where SROA looks for promotable allocas.
        with builder.goto_entry_block():
            slot = builder.alloca(ir.ArrayType(elem_ty, n))
        zero = ir.Constant(ir.IntType(32), 0)
        for i in range(n):
            ptr = builder.gep(slot, [zero, ir.Constant(ir.IntType(32), i)])
            builder.store(builder.extract_value(value, i), ptr)
        itemsize = context.get_abi_sizeof(elem_ty)
        ary = context.make_array(arrty)(context, builder)
        context.populate_array(
            ary,
            data=builder.gep(slot, [zero, zero]),
            shape=[context.get_constant(types.intp, n)],
            strides=[context.get_constant(types.intp, itemsize)],
            itemsize=context.get_constant(types.intp, itemsize),
            meminfo=None,
        )
        return ary._getvalue()

    return arrty(tup), codegen
