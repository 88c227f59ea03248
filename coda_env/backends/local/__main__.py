"""`python -m coda_env.backends.local --watchdog TOKEN FOLDER`: the desktop's watchdog (processes.py)."""

import sys

from .processes import _watchdog_main

if len(sys.argv) == 4 and sys.argv[1] == "--watchdog":
    _watchdog_main(sys.argv[2], sys.argv[3])
