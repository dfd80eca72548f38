"""Stand-ins for device objects, for CPU-only tests."""


class FakeCAI:
    """A device array as far as __cuda_array_interface__ goes (the pointer is never touched)."""

    def __init__(self, shape, typestr, ptr=0x7F0000000000, strides=None, mask=None):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
            "mask": mask,
        }
