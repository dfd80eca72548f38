"""Every use of numba-cuda's private internals lives here.

numba-cuda is in maintenance mode and its successor (numba-cuda-mlir) has a different
compiler; keeping the private touch points in one module means a port changes one file.
The rest of the package uses only public API: ``cuda.jit``, ``numba.cuda.extending`` and
``numba.cuda.types``.

What is private and why:
- compiling a kernel for an explicit ``cc`` without a GPU, through the same code path as
  ``_Kernel.__init__`` (compile_cuda + kernel_fixup + launch bounds + LTO link), into a code
  library or a whole ``_Kernel``;
- the linker, to link the same LTO-IR verbosely for ptxas' resource report;
- LLVM helpers for declaring shared-memory globals in an intrinsic (cgutils);
- an ``@intrinsic`` that prefers literal argument types (``literal_intrinsic``): the public
  ``numba.cuda.extending.intrinsic`` takes no options;
- the per-signature ``_Kernel`` object, its argument packing (and where each argument's
  values land in the packed list, so a prepared launch can rebind pointers) and its
  ``CUkernel`` handle, used by the cluster/large-shared-memory launcher;
- pickling a ``_Kernel`` and adding one to a dispatcher, as numba's own disk cache does,
  for numba_hopper's kernel cache (``_kernel_cache``); and a cubin-only form of a kernel
  for the prebuilt kernels (``prebuild``);
- by-value kernel parameters (:class:`ByValueParam`, CUDA C++'s ``__grid_constant__``):
  numba passes every argument as flattened scalars, so the kernel's LLVM function is
  rewritten after numba lowers it (a ``byval`` pointer parameter with NVVM's
  ``grid_constant`` annotation), and such a kernel is compiled through this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import pickle

from llvmlite import ir
from numba.cuda import cgutils  # noqa: F401  (re-exported for intrinsics)
from numba.cuda import types
from numba.cuda.compiler import compile_cuda, kernel_fixup
from numba.cuda.core import sigutils
from numba.cuda.cudadrv import nvvm
from numba.cuda.extending import _intrinsic, models, register_model

__all__ = [
    "ByValueParam",
    "cgutils",
    "literal_intrinsic",
    "compile_kernel_library",
    "compile_kernel",
    "link_verbose",
    "kernel_for_args",
    "pack_kernel_args",
    "argument_leaves",
    "cu_kernel",
    "static_shared_bytes",
    "arg_types",
    "array_interface_type",
    "has_overload",
    "serialize_kernel",
    "add_serialized_kernel",
    "serialize_cubin_kernel",
    "cubin_kernel",
    "add_cubin_kernel",
]


class ByValueParam(types.Type):
    """A kernel parameter of ``nbytes`` bytes passed by value in 64-byte-aligned param space
    (``.param .align 64 .b8 p[nbytes]``), as CUDA C++ passes a ``const __grid_constant__
    CUtensorMap``: what CUTLASS, Triton and DeepGEMM do with TMA descriptors.

    In the kernel its value is the parameter's generic address (``cvta.param``), which is
    what a TMA instruction takes as its tensor map (PTX ISA, "Tensor Map": param, const or
    global memory). The host passes a ctypes object of ``nbytes`` bytes. A kernel taking one
    is compiled by :func:`compile_kernel` or :func:`kernel_for_args` (numba's own compile
    would pass the address as a plain integer) and launched by ``numba_hopper.runtime.launch``.
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        super().__init__(name=f"ByValueParam({nbytes})")


@register_model(ByValueParam)
class _ByValueModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.IntType(64))


class _TypelessByval(ir.values.ArgumentAttributes):
    """Argument attributes printed as NVVM's LLVM dialect reads them: ``byval``, not
    ``byval(<type>)``."""

    def _expand(self, name, typ):
        return name


def _by_value_params(argtypes):
    """``(LLVM parameter index, bytes)`` of each :class:`ByValueParam` among ``argtypes``."""
    found, at = [], 0

    def walk(ty):
        nonlocal at
        if isinstance(ty, types.BaseTuple):
            for member in ty:
                walk(member)
            return
        if isinstance(ty, ByValueParam):
            found.append((at, ty.nbytes))
        at += _param_count(ty)

    for ty in argtypes:
        walk(ty)
    return found


def _pass_by_value(kernel, params):
    """Make ``kernel``'s i64 parameters at ``params`` by-value ``byval`` parameters.

    Each becomes ``[n x i64]* byval align 64`` with NVVM's ``grid_constant`` annotation, and
    the body, which used the i64, now reads ``ptrtoint`` of that pointer: with the
    annotation NVVM takes the parameter's address in place (``mov`` + ``cvta.param``)
    instead of copying it to local memory.
    """
    if not params:
        return
    i64 = ir.IntType(64)
    entry = kernel.blocks[0]
    builder = ir.IRBuilder(entry)
    builder.position_at_start(entry)
    args = list(kernel.args)
    for at, nbytes in params:
        value = args[at]
        param = ir.Argument(kernel, ir.ArrayType(i64, nbytes // 8).as_pointer(), name=value.name + ".byval")
        param.attributes = _TypelessByval(["byval"])
        param.attributes.align = 64
        address = builder.ptrtoint(param, i64, name=value.name + ".address")
        value._name = address.name  # the body's uses of the old parameter now name the address
        args[at] = param
    kernel.args = tuple(args)
    kernel.type = ir.PointerType(ir.FunctionType(ir.VoidType(), [a.type for a in args]))
    module = kernel.module
    used = module.globals.get("llvm.used")  # its constant was formatted with the old type
    if used is not None:
        refers = kernel.get_reference()
        used.initializer = ir.Constant(used.initializer.type, [
            kernel.bitcast(ir.IntType(8).as_pointer()) if refers in str(c) else c
            for c in used.initializer.constant])
    indices = module.add_metadata([ir.Constant(ir.IntType(32), at + 1) for at, _ in params])
    module.add_named_metadata("nvvm.annotations", [kernel, ir.MetaDataString(module, "grid_constant"), indices])


def literal_intrinsic(func):
    """``@intrinsic`` whose typer sees literal argument types first.

    numba types a call twice at most: by default with non-literal types first, then with
    literal ones. Preferring literals lets a typer that needs a compile-time constant reject
    a run-time value at once, with its own message (the fallback call, with non-literal
    types, then fails too and numba reports both).
    """
    return _intrinsic(target="cuda", prefer_literal=True)(func)


def _arch(cc) -> str:
    return "sm_%d%d%s" % (cc[0], cc[1], cc[2] if len(cc) > 2 else "")


class _AssumedDevice:
    """Stands in for the current device while compiling for an explicit ``cc``."""

    def __init__(self, cc):
        self.compute_capability = tuple(cc[:2])


@contextlib.contextmanager
def _assume_device(cc):
    """Make numba compile device functions for ``cc`` without asking the driver.

    ``Dispatcher.compile_device`` reads the current device's compute capability, so a
    kernel that calls a ``@cuda.jit(device=True)`` function cannot be compiled on a machine
    without a GPU otherwise. The capability only selects lowering flags (the target arch
    comes from the explicit ``cc`` at link time).
    """
    from numba.cuda import dispatcher as _dispatcher

    saved = _dispatcher.get_current_device
    _dispatcher.get_current_device = lambda: _AssumedDevice(cc)
    try:
        yield
    finally:
        _dispatcher.get_current_device = saved


def _compile(dispatcher, signature, cc):
    """numba's compile result for ``dispatcher`` (a ``@cuda.jit`` kernel), ``signature`` and
    ``cc``, its kernel function fixed up as ``_Kernel.__init__`` does; no device needed."""
    opts = dispatcher.targetoptions
    argtypes, restype = sigutils.normalize_signature(signature)
    if restype not in (None, types.void):
        raise TypeError("kernels return void; got a signature returning %s" % restype)
    debug = opts.get("debug", False)
    lto = opts.get("lto")
    if lto is None:
        from numba.cuda.cudadrv.driver import _have_nvjitlink

        lto = _have_nvjitlink() and not debug
    nvvm_options = {"fastmath": opts.get("fastmath", False), "opt": 3 if opts.get("opt", True) else 0}
    if debug:
        nvvm_options["g"] = None
    with _assume_device(cc):
        cres = compile_cuda(
            dispatcher.py_func,
            types.void,
            argtypes,
            debug=debug,
            lineinfo=opts.get("lineinfo", False),
            forceinline=opts.get("forceinline", False),
            fastmath=opts.get("fastmath", False),
            nvvm_options=nvvm_options,
            cc=cc,
            max_registers=opts.get("max_registers"),
            lto=lto,
        )
    lib = cres.library
    kernel = lib.get_function(cres.fndesc.llvm_func_name)
    lib._entry_name = cres.fndesc.llvm_func_name
    kernel_fixup(kernel, debug)
    _pass_by_value(kernel, _by_value_params(argtypes))
    nvvm.set_launch_bounds(kernel, opts.get("launch_bounds"))
    return cres


def compile_kernel_library(dispatcher, signature, cc):
    """Compile ``dispatcher`` (a ``@cuda.jit`` kernel) for ``signature`` and ``cc``.

    Mirrors ``numba.cuda.dispatcher._Kernel.__init__`` without touching a device, so the
    returned code library links (``lib.get_cubin(cc)``) exactly as a launch would: LTO-IR
    through nvJitLink unless the kernel was declared with ``lto=False`` or ``debug=True``.
    Returns ``(library, entry_name)``.
    """
    cres = _compile(dispatcher, signature, cc)
    return cres.library, cres.library._entry_name


def compile_kernel(dispatcher, argtypes, cc):
    """The ``_Kernel`` that ``dispatcher.compile(argtypes)`` gives on a ``cc`` device (e.g.
    ``(9, 0, "a")``), built without one, with its cubin for ``cc`` linked.

    As ``_Kernel.__init__``, with one difference: a kernel that would link extra files
    (``link=``, numba's reshape helpers, the NRT library) raises ValueError, since such a
    code library cannot be serialized.
    """
    from numba.cuda.dispatcher import _Kernel, reshape_funcs

    cres = _compile(dispatcher, argtypes, cc)
    lib, opts = cres.library, dispatcher.targetoptions
    if lib.use_cooperative:
        lib.needs_cudadevrt = True
    # _Kernel.__init__ looks for the helpers in the PTX, which names what it calls.
    ptx = lib.get_asm_str(cc=cc)
    link = list(opts.get("link") or ()) + [fn for fn in reshape_funcs if fn in ptx]
    _Kernel.maybe_link_nrt(_Kernel, link, cres.target_context, ptx)  # (reads no instance state)
    if link:
        raise ValueError(f"{dispatcher.py_func.__qualname__} links {link}; only self-contained kernels are supported")
    carveout = opts.get("shared_memory_carveout")
    kernel = _Kernel._rebuild(
        cooperative=lib.use_cooperative,
        name=lib._entry_name,
        signature=cres.signature,
        codelibrary=lib,
        debug=opts.get("debug", False),
        lineinfo=opts.get("lineinfo", False),
        call_helper=cres.call_helper,
        extensions=opts.get("extensions") or [],
        shared_memory_carveout=None if carveout is None else _Kernel._parse_carveout(_Kernel, carveout),
        launch_config_sensitive=bool(getattr(cres, "metadata", None)
                                     and cres.metadata.get("launch_config_sensitive", False)),
    )
    lib.get_cubin(cc=cc)
    return kernel


def link_verbose(library, cc) -> tuple:
    """Link ``library`` for ``cc`` as numba does, with ``ptxas -v``; return ``(cubin, log)``.

    numba's own link keeps no resource report; this link of the same objects with the same
    options adds only the verbose flag: the same code (its cubin differs from numba's only in
    the note that records ptxas' options).
    """
    from cuda.core import Linker, LinkerOptions, ObjectCode

    if library._lto:
        objects = [ObjectCode.from_ltoir(library.get_ltoir(cc=cc))]
    else:
        objects = [ObjectCode.from_ptx(p.encode()) for p in library.get_asm_strs(cc=cc)]
    options = LinkerOptions(
        arch=_arch(cc),
        max_register_count=library._max_registers or None,
        link_time_optimization=True if library._lto else None,
        ptxas_options="-v",
    )
    linker = Linker(*objects, options=options)
    try:
        cubin = bytes(linker.link("cubin").code)
        return cubin, linker.get_info_log() or ""
    finally:
        linker.close()


# --- launch-side internals ---------------------------------------------------------


def kernel_for_args(dispatcher, args):
    """The compiled ``_Kernel`` that ``dispatcher[...](*args)`` would launch (compiles once).

    Exact argument types first (compiling them if the dispatcher may); a dispatcher declared
    with one signature and no further compilation gets that signature, whose scalar
    parameters numba's packing converts to.
    """
    if dispatcher.specialized:
        return next(iter(dispatcher.overloads.values()))
    argtypes = arg_types(dispatcher, args)
    kernel = dispatcher.overloads.get(argtypes)
    if kernel is not None:
        return kernel
    if not dispatcher._can_compile and len(dispatcher.overloads) == 1:
        return next(iter(dispatcher.overloads.values()))
    if not _by_value_params(argtypes):
        return dispatcher.compile(argtypes)
    from numba import cuda

    cc = cuda.get_current_device().compute_capability
    kernel = compile_kernel(dispatcher, argtypes, (*cc, "a" if cc >= (9, 0) else ""))  # numba's own cc
    kernel.bind()
    dispatcher.add_overload(kernel, argtypes)
    return kernel


def pack_kernel_args(kernel, args, stream=0):
    """Flatten ``args`` into the kernel's parameter list exactly as numba's launch does."""
    if len(args) != len(kernel.argument_types):
        raise TypeError(
            f"the kernel takes {len(kernel.argument_types)} arguments ({kernel.argument_types}); got {len(args)}"
        )
    packed, writeback = [], []

    def pack(ty, val):
        if isinstance(ty, ByValueParam):
            if ctypes.sizeof(val) != ty.nbytes:
                raise TypeError(f"a {ty} parameter needs a ctypes object of {ty.nbytes} bytes; got {val!r}")
            packed.append(val)
        elif isinstance(ty, types.BaseTuple) and _by_value_params([ty]):
            for member_ty, member in zip(ty, val):
                pack(member_ty, member)
        else:
            kernel._prepare_args(ty, val, stream, writeback, packed)

    for ty, val in zip(kernel.argument_types, args):
        pack(ty, val)
    if writeback:
        raise TypeError(
            "host arrays were passed to a kernel launched by numba_hopper.runtime.launch; "
            "copy them to the device first"
        )
    # numba leaves array fields (pointers, sizes, shapes, strides) as Python ints and
    # booleans as bools, as cuda.core's launch reads them; make every parameter a ctypes value.
    if len(packed) != sum(_param_count(ty) for ty in kernel.argument_types):
        raise RuntimeError(f"numba packed {len(packed)} parameters for {kernel.argument_types}, not the expected count")
    return [_as_ctypes(v) for v in packed]


def argument_leaves(kernel) -> list:
    """Where each argument of a compiled ``_Kernel`` lands in :func:`pack_kernel_args`' list.

    One entry per argument, mirroring its structure: an index for a scalar (its parameter)
    or an array (its data pointer), a list of entries for a tuple. numba passes an array as
    ``meminfo, parent, nitems, itemsize, data, shape..., strides...`` and a tuple as its
    members in order.
    """
    leaves, at = [], 0
    for ty in kernel.argument_types:
        leaves.append(_leaves(ty, at))
        at += _param_count(ty)
    return leaves


def _leaves(ty, at):
    if isinstance(ty, types.BaseTuple):
        members = []
        for member in ty:
            members.append(_leaves(member, at))
            at += _param_count(member)
        return members
    return at + 4 if isinstance(ty, types.Array) else at


def _param_count(ty) -> int:
    if isinstance(ty, types.Array):
        return 5 + 2 * ty.ndim
    if isinstance(ty, types.BaseTuple):
        return sum(_param_count(member) for member in ty)
    return 2 if ty in (types.complex64, types.complex128) else 1


def _as_ctypes(value):
    if isinstance(value, (ctypes._SimpleCData, ctypes.Structure)):
        return value
    if isinstance(value, bool):
        return ctypes.c_bool(value)
    if isinstance(value, int):
        return ctypes.c_ssize_t(value)  # intptr_t
    if isinstance(value, float):
        return ctypes.c_double(value)
    raise TypeError(f"cannot pass {type(value).__name__} {value!r} as a kernel parameter")


def cu_kernel(kernel):
    """The cuda.core ``Kernel`` (wrapping a ``CUkernel``) of a ``_Kernel`` in the current context."""
    cufunc = kernel._codelibrary.get_cufunc()
    kernel.initialize_once(cufunc.module)
    return cufunc.kernel


def static_shared_bytes(kernel) -> int:
    """Static shared memory of a compiled ``_Kernel`` (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)."""
    return int(kernel._codelibrary.get_cufunc().attrs.shared)


# --- the kernel cache's internals ------------------------------------------------------


def arg_types(dispatcher, args) -> tuple:
    """The numba types ``dispatcher`` would compile ``args`` as."""
    return tuple(dispatcher.typeof_pyval(a) for a in args)


def array_interface_type(desc):
    """The numba type of the argument ``cuda.from_cuda_array_interface(desc)`` makes ("C" or
    "F" where contiguous and not broadcast, else "A"), without a device: the same
    ``DeviceNDArray`` over no memory, typed and never used."""
    from numba.cuda.api_util import prepare_shape_strides_dtype
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.typing.typeof import Purpose, typeof

    shape, strides, dtype = prepare_shape_strides_dtype(desc["shape"], desc.get("strides"), desc["typestr"], order="C")
    return typeof(DeviceNDArray(shape, strides, dtype, gpu_data=_NO_MEMORY), Purpose.argument)


_NO_MEMORY = object()  # (array_interface_type's arrays hold no memory)


def has_overload(dispatcher, argtypes) -> bool:
    """Whether ``dispatcher`` holds a kernel it would launch for ``argtypes`` (no compile)."""
    return dispatcher.specialized or argtypes in dispatcher.overloads


def serialize_kernel(kernel) -> bytes:
    """A compiled ``_Kernel`` as numba's disk cache pickles it (with its linked cubins)."""
    from numba.cuda.serialize import dumps

    return dumps(kernel)


def add_serialized_kernel(dispatcher, data: bytes):
    """Unpickle a ``serialize_kernel`` result into ``dispatcher`` as a compiled overload."""
    kernel = pickle.loads(data)
    dispatcher.add_overload(kernel, kernel.argument_types)
    return kernel


def serialize_cubin_kernel(kernel, cc) -> bytes:
    """``kernel`` with nothing but its linked cubin for ``cc``: no LLVM IR, PTX or LTO-IR.

    About 5% of :func:`serialize_kernel`'s size, and independent of the Python version:
    numba's pickler (cloudpickle) stores one of its own functions by value, as bytecode of
    the Python that wrote it; this is the standard pickler over the same ``_reduce_states``
    (with the cubin as bytes), which refers to every class and function by name. A device
    of another ``cc`` cannot run the result (there is nothing left to link).
    """
    lib = kernel._codelibrary
    library = lib._reduce_states()  # refuses libraries with linking files or captured arrays
    library.update(llvm_strs=[], ptx_cache={}, linkerinfo_cache={},
                   cubin_cache={cc: bytes(lib.get_cubin(cc=cc).code)})
    return pickle.dumps(dict(kernel._reduce_states(), codelibrary=library), protocol=4)


def cubin_kernel(data: bytes):
    """The ``_Kernel`` of a :func:`serialize_cubin_kernel` result (no device needed)."""
    from cuda.core import ObjectCode
    from numba.cuda.codegen import CUDACodeLibrary
    from numba.cuda.dispatcher import _Kernel

    states = pickle.loads(data)
    library = states["codelibrary"]
    library["cubin_cache"] = {cc: ObjectCode.from_cubin(cubin, name=library["name"])
                              for cc, cubin in library["cubin_cache"].items()}
    return _Kernel._rebuild(**dict(states, codelibrary=CUDACodeLibrary._rebuild(**library)))


def add_cubin_kernel(dispatcher, data: bytes):
    """Add the kernel of a :func:`serialize_cubin_kernel` result to ``dispatcher``, bound to
    the current context first (as ``dispatcher.compile`` does): a cubin this driver rejects
    raises here, before the dispatcher holds it."""
    kernel = cubin_kernel(data)
    kernel.bind()
    dispatcher.add_overload(kernel, kernel.argument_types)
    return kernel
