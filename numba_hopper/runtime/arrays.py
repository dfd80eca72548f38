"""One view of a device array, whichever framework made it.

``device_view(obj)`` reads the pointer, shape, element strides, dtype and device of

- numba device arrays and anything else with ``__cuda_array_interface__``;
- PyTorch CUDA tensors, through ``data_ptr()``/``shape``/``stride()``/``dtype`` (the CUDA
  array interface has no bfloat16 and no float8, PyTorch's own attributes do);
- CuPy arrays, through ``data.ptr``/``shape``/``strides``/``dtype``/``device``: CuPy 14
  holds bfloat16 as ``ml_dtypes.bfloat16``, which its array interface cannot name.

Nothing here imports torch or cupy: a framework is recognised by ``type(obj).__module__``.

Dtypes are canonical short names (``DTYPES``). bfloat16 and float8 data held in an integer
array (numba, and CuPy before 14, have no such dtypes) is described with ``dtype="bf16"`` (over a 2-byte
array) or ``dtype="e4m3"``/``"e5m2"`` (over a 1-byte array); ``"tf32"`` (over float32) is
never inferred, only requested. An override must have the storage's item size.

Below the view: the layout predicates TMA cares about (row- or column-major, leading
dimension, 16-byte addressability) and ``byte_span`` for overlap checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceView", "device_view", "DTYPES", "ITEMSIZE", "transpose", "is_row_major", "is_col_major",
           "leading_dim", "tma_addressable", "canonical", "byte_span", "merge_rows"]

# canonical name -> item size in bytes
ITEMSIZE = {
    "u8": 1,
    "i8": 1,
    "e4m3": 1,
    "e5m2": 1,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "u32": 4,
    "i32": 4,
    "f32": 4,
    "tf32": 4,
    "u64": 8,
    "i64": 8,
    "f64": 8,
}
DTYPES = tuple(ITEMSIZE)

# numpy dtype names (what the CUDA array interface's typestr decodes to)
_NUMPY_NAMES = {
    "uint8": "u8",
    "int8": "i8",
    "uint16": "u16",
    "float16": "f16",
    "uint32": "u32",
    "int32": "i32",
    "float32": "f32",
    "uint64": "u64",
    "int64": "i64",
    "float64": "f64",
    # ml_dtypes / numpy extension dtypes, if a producer exports them by name
    "bfloat16": "bf16",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
}

# str(torch.dtype) -> canonical name
_TORCH_NAMES = {
    "torch.uint8": "u8",
    "torch.int8": "i8",
    "torch.float8_e4m3fn": "e4m3",
    "torch.float8_e5m2": "e5m2",
    "torch.uint16": "u16",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.uint32": "u32",
    "torch.int32": "i32",
    "torch.float32": "f32",
    "torch.uint64": "u64",
    "torch.int64": "i64",
    "torch.float64": "f64",
}


@dataclass(frozen=True)
class DeviceView:
    """A device array as TMA sees it. ``strides`` are in elements, numpy (outer..inner) order."""

    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    itemsize: int
    device: int
    framework: str  # "numba" | "cupy" | "torch" | "cai"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def byte_strides(self) -> tuple:
        return tuple(s * self.itemsize for s in self.strides)

    def with_dtype(self, dtype: str) -> "DeviceView":
        """The same memory described as ``dtype`` (same item size)."""
        return DeviceView(self.ptr, self.shape, self.strides, _override(self.dtype, dtype),
                          self.itemsize, self.device, self.framework)


def _override(current: str, requested: str | None) -> str:
    if requested is None:
        return current
    if requested not in ITEMSIZE:
        raise ValueError(f"unknown dtype {requested!r}; expected one of {', '.join(DTYPES)}")
    if ITEMSIZE[requested] != ITEMSIZE[current]:
        raise ValueError(
            f"dtype override {requested!r} ({ITEMSIZE[requested]}-byte elements) does not match the "
            f"array's {current!r} storage ({ITEMSIZE[current]}-byte elements)"
        )
    return requested


def _root_module(obj) -> str:
    return (type(obj).__module__ or "").split(".", 1)[0]


def _pointer_device(ptr: int) -> int:
    """Device ordinal of a device pointer, asked of the driver (0 where it cannot answer)."""
    try:
        from cuda.bindings import driver

        err, ordinal = driver.cuPointerGetAttribute(
            driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr
        )
        if err == driver.CUresult.CUDA_SUCCESS:
            return int(ordinal)
    except Exception:  # no driver (CPU-only machine) or an old binding
        pass
    return 0


def _from_torch(t, dtype) -> DeviceView:
    dev = t.device
    if dev.type != "cuda":
        raise TypeError(
            f"a torch tensor on '{dev}' is not a CUDA device array; move it with .cuda() first"
        )
    name = _TORCH_NAMES.get(str(t.dtype))
    if name is None:
        raise TypeError(f"torch dtype {t.dtype} has no TMA element type")
    return DeviceView(
        ptr=int(t.data_ptr()),
        shape=tuple(int(s) for s in t.shape),
        strides=tuple(int(s) for s in t.stride()),
        dtype=_override(name, dtype),
        itemsize=ITEMSIZE[name],
        device=int(dev.index if dev.index is not None else 0),
        framework="torch",
    )


def _from_cupy(a, dtype) -> DeviceView:
    name = _NUMPY_NAMES.get(a.dtype.name)
    if name is None:
        raise TypeError(f"cupy dtype {a.dtype} has no TMA element type (bfloat16 data in uint16: pass dtype='bf16')")
    itemsize = ITEMSIZE[name]
    return DeviceView(
        ptr=int(a.data.ptr),
        shape=tuple(int(s) for s in a.shape),
        strides=tuple(int(s) // itemsize for s in a.strides),
        dtype=_override(name, dtype),
        itemsize=itemsize,
        device=int(a.device.id),
        framework="cupy",
    )


def _from_cai(obj, cai, framework, dtype, device) -> DeviceView:
    import numpy as np

    if cai.get("mask") is not None:
        raise TypeError("masked CUDA arrays (__cuda_array_interface__ 'mask') are not supported")
    ptr = int(cai["data"][0])
    shape = tuple(int(s) for s in cai["shape"])
    try:
        np_dtype = np.dtype(cai["typestr"])
    except TypeError as exc:
        raise TypeError(f"unsupported CUDA array typestr {cai['typestr']!r}") from exc
    name = _NUMPY_NAMES.get(np_dtype.name)
    if name is None:
        raise TypeError(
            f"dtype {np_dtype} has no TMA element type (bfloat16 data in an integer array: pass "
            f"dtype='bf16'); supported: {', '.join(_NUMPY_NAMES)}"
        )
    itemsize = ITEMSIZE[name]
    byte_strides = cai.get("strides")
    if byte_strides is None:  # C-contiguous
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        if any(int(b) % itemsize for b in byte_strides):
            raise ValueError(f"strides {tuple(byte_strides)} are not whole elements of {itemsize} bytes")
        strides = tuple(int(b) // itemsize for b in byte_strides)
    if device is None:
        device = _pointer_device(ptr) if ptr else 0
    return DeviceView(ptr, shape, strides, _override(name, dtype), itemsize, int(device), framework)


def device_view(obj, dtype: str | None = None) -> DeviceView:
    """Describe a CUDA device array (numba, CuPy, PyTorch or any ``__cuda_array_interface__``).

    ``dtype`` re-reads the elements as another type of the same size (``"bf16"`` over uint16,
    ``"e4m3"``/``"e5m2"`` over uint8, ``"tf32"`` over float32). Host arrays raise TypeError.
    A ``DeviceView`` passes through (with the override applied).
    """
    if isinstance(obj, DeviceView):
        return obj.with_dtype(dtype) if dtype else obj
    root = _root_module(obj)
    if root == "torch" and hasattr(obj, "data_ptr"):
        return _from_torch(obj, dtype)
    if root == "cupy" and hasattr(obj, "data") and hasattr(obj, "device"):
        return _from_cupy(obj, dtype)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        if root == "numpy" or hasattr(obj, "__array_interface__"):
            raise TypeError(
                f"{type(obj).__name__} is a host (CPU) array; copy it to the GPU first "
                f"(numba.cuda.to_device, cupy.asarray, tensor.cuda())"
            )
        raise TypeError(
            f"{type(obj).__name__} is not a CUDA device array: expected a numba device array, "
            f"a CuPy array, a CUDA torch tensor or an object with __cuda_array_interface__"
        )
    framework = "numba" if root == "numba" else "cai"
    return _from_cai(obj, cai, framework, dtype, None)


def merge_rows(v: DeviceView) -> DeviceView | None:
    """A (..., K) view as the (rows, K) matrix it is (``torch.matmul``'s fold of a batch of
    activations), with no data moved; None when the leading dimensions' strides do not merge
    into one row stride."""
    if v.ndim <= 2:
        return v
    rows = 1
    for n in v.shape[:-1]:
        rows *= n
    outer = [(n, s) for n, s in zip(v.shape[:-1], v.strides[:-1]) if n != 1]
    if rows and any(s != n * s_in for (_, s), (n, s_in) in zip(outer, outer[1:])):
        return None
    row_stride = outer[-1][1] if outer else v.strides[-2]  # (a single row: never stepped)
    return DeviceView(v.ptr, (rows, v.shape[-1]), (row_stride, v.strides[-1]), v.dtype, v.itemsize, v.device,
                      v.framework)


# --- layouts of 2-D views, as TMA sees them ------------------------------------------------


def transpose(v: DeviceView) -> DeviceView:
    """The transpose of a 2-D view (no data moves)."""
    return DeviceView(v.ptr, v.shape[::-1], v.strides[::-1], v.dtype, v.itemsize, v.device, v.framework)


def is_row_major(v: DeviceView) -> bool:
    """True when ``v``'s rows are dense (unit column stride) and do not overlap; a single row or
    column counts whatever its other stride."""
    rows, cols = v.shape
    return (v.strides[1] == 1 or cols <= 1) and (v.strides[0] >= cols or rows <= 1)


def is_col_major(v: DeviceView) -> bool:
    """True when ``v`` is not row-major but its transpose is."""
    return not is_row_major(v) and is_row_major(transpose(v))


def leading_dim(v: DeviceView) -> int:
    """Elements between consecutive rows of a row-major view (>= its width).

    A single row has no meaningful stride (frameworks report anything): use the width
    rounded up to 16 bytes, which is what TMA asks of a stride it never steps.
    """
    if v.shape[0] > 1:
        return v.strides[0]
    pad = 16 // v.itemsize
    return -(-max(v.shape[1], 1) // pad) * pad


def tma_addressable(v: DeviceView, row_major: bool) -> bool:
    """Can TMA read ``v`` (or its transpose, if not ``row_major``) as a row-major matrix?"""
    w = v if row_major else transpose(v)
    return is_row_major(w) and v.ptr % 16 == 0 and (leading_dim(w) * v.itemsize) % 16 == 0


def canonical(v: DeviceView) -> DeviceView:
    """A row-major view with the strides TMA is given: ``(leading dim, 1)``."""
    return DeviceView(v.ptr, v.shape, (leading_dim(v), 1), v.dtype, v.itemsize, v.device, v.framework)


def byte_span(v: DeviceView) -> int:
    """Bytes from ``v``'s first element to one past its last (non-negative strides)."""
    return sum((n - 1) * s for n, s in zip(v.shape, v.byte_strides)) + v.itemsize if 0 not in v.shape else 0
