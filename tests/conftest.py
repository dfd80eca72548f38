import pytest

from numba_hopper._device import hopper_device_reason


def pytest_collection_modifyitems(config, items):
    reason = hopper_device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
