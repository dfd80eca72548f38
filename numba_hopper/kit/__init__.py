"""The kernel-authoring kit: device-side parts for any ``@cuda.jit`` Hopper kernel.

- :mod:`.pipeline`: TMA producer/consumer rings over mbarriers.
"""
