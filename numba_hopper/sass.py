"""Deprecated alias of :mod:`numba_hopper.tools.sass`: importing it warns and gives that module."""

import importlib
import sys
import warnings

warnings.warn("numba_hopper.sass is now numba_hopper.tools.sass", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("numba_hopper.tools.sass")
