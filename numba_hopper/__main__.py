"""``python -m numba_hopper [check | inspect | bench | prebuild]``: see ``numba_hopper.tools.cli``.

Without a command it checks: on a Hopper GPU it runs and checks the shipped kernels; with
none it compiles them for sm_90a and prints what they compiled to. ``--help`` lists the
commands and ``--version`` prints the versions; neither compiles anything.
"""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
