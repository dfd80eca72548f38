"""Deprecated alias of :mod:`numba_hopper.runtime.tensormap`: importing it warns and gives that module."""

import importlib
import sys
import warnings

warnings.warn("numba_hopper.tensormap is now numba_hopper.runtime.tensormap", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("numba_hopper.runtime.tensormap")
