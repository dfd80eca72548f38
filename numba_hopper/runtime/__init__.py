"""The host runtime: device arrays, TMA tensor maps, kernel launch and the kernel cache.

What a kernel author uses from here::

    from numba_hopper.runtime.launch import launch
    from numba_hopper.runtime.tensormap import TensorMap

    tmap = TensorMap(a, box=(64, 64), swizzle=128, dtype="bf16")
    launch(kernel, grid=..., block=384, args=(tmap.device_ptr, ...), cluster=(2, 1),
           shared_mem=200 * 1024, stream=stream)

- :mod:`.tensormap`: ``CUtensorMap`` descriptors, in device memory or passed by value;
- :mod:`.launch`: cluster launch, dynamic shared memory over 48 KB, programmatic dependent
  launch, prepared launches;
- :mod:`.arrays`: one view (:class:`~numba_hopper.runtime.arrays.DeviceView`) of any framework's
  device array;
- :mod:`.device`: whether there is a Hopper GPU;
- :mod:`.debug`: debug mode (bounded pipeline waits that report a hang);
- :mod:`.kernel_cache`, :mod:`.workspace`, :mod:`.operands`, :mod:`.placement`: what the GEMM's
  call path needs beside them (compiled kernels on disk, stream-ordered scratch, cheap reads of
  the caller's arrays, the GPC order of the SMs).
"""
