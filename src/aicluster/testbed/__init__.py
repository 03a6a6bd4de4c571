"""The local testbed: N systemd-nspawn nodes on bridges, with package proxies.

Python API (the CLI is ``aicluster testbed ...``)::

    from aicluster.testbed import up, down, status
    from aicluster.testbed.state import load_state, fabric_address

See ``docs/testbed.md``.
"""

from aicluster.testbed.core import down, status, up
from aicluster.testbed.errors import TestbedError
from aicluster.testbed.state import fabric_address, load_state

__all__ = ["TestbedError", "down", "fabric_address", "load_state", "status", "up"]
