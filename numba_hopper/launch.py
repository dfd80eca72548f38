"""Deprecated alias of :mod:`numba_hopper.runtime.launch`: importing it warns and gives that module."""

import importlib
import sys
import warnings

warnings.warn("numba_hopper.launch is now numba_hopper.runtime.launch", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("numba_hopper.runtime.launch")
