"""`python -m coda_env.backends.libvirt --watchdog URI NAME POOL VOLUME`: the watchdog process (watchdog.py)."""

import sys

from .watchdog import _watchdog_main

if len(sys.argv) == 6 and sys.argv[1] == "--watchdog":
    _watchdog_main(*sys.argv[2:6])
else:
    sys.exit("usage: python -m coda_env.backends.libvirt --watchdog URI NAME POOL VOLUME")
