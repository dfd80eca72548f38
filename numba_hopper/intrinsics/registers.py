"""Register-tuple helpers for wgmma accumulators and fragments.

numba lowers ``tup[i]`` with a run-time ``i`` to a switch over every element; inside an
epilogue loop over a 128-float accumulator that switch is too big for LLVM to unroll, so
the loop stays rolled with hundreds of branches. :func:`tuple_as_array` instead copies the
tuple once into a thread-local array; indexing that array in loops with constant trip
counts unrolls, every index becomes a constant, and the array is promoted back to
registers (no local memory: check ``report.stack_frame == 0``). A run-time index that
survives unrolling would put it in local memory, which the inspection report shows.
:func:`array_as_tuple` goes back: a function that built its result in such an array
returns it as a tuple (a value; an array would point into the returning function's frame).
"""

from llvmlite import ir
from numba.cuda import types

from ._ptx import intrinsic

__all__ = ["tuple_as_array", "array_as_tuple"]


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


@intrinsic
def array_as_tuple(typingctx, arr, like):
    """The first ``len(like)`` elements of the 1-D array ``arr`` as a tuple of ``like``'s type."""
    if not (isinstance(like, types.UniTuple) and isinstance(arr, types.Array) and arr.ndim == 1
            and arr.dtype == like.dtype):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        elems = [builder.load(builder.gep(ary.data, [ir.Constant(ir.IntType(64), i)])) for i in range(like.count)]
        return context.make_tuple(builder, like, elems)

    return like(arr, like), codegen
