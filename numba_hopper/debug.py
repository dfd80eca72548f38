"""Deprecated alias of :mod:`numba_hopper.runtime.debug`: importing it warns and gives that module."""

import importlib
import sys
import warnings

warnings.warn("numba_hopper.debug is now numba_hopper.runtime.debug", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("numba_hopper.runtime.debug")
