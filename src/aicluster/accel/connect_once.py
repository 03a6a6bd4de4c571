"""A fix to pyinfra for aicluster's deploy, installed by ``aicluster.accel.enable``.

One connection per host. pyinfra connects to a host outside the ones it runs on (the
hosts ``--limit`` leaves out) when a deploy first reads one of its facts. A
component's deploy reads the other nodes' facts (Ray's head and workers must agree on
Python and addresses; Slurm's controller reads every node's hardware), and pyinfra
runs the deploy of all its hosts at once, each in its own greenlet. Two of them
reading the same left-out host both find it not connected yet (``Host.connected`` is
set only once the SSH handshake is done, and the handshake lets the other greenlet
run) and both connect: the second connection replaces the first under the first
reader, whose command then waits forever for a channel that never opens.
``pyinfra --limit node1 --limit node2`` on a cluster of ten hung that way.

:func:`connect_once` makes ``Host.connect`` take a per-host lock and look again
whether the host got connected while it waited, so a host is connected once and every
reader uses that connection.
"""

from __future__ import annotations

from aicluster.accel.guard import PATCHES

_INSTALLED: list[bool] = []


def connect_once() -> None:
    """Make pyinfra's ``Host.connect`` connect each host once, however many greenlets
    ask at the same time (idempotent; undone by ``aicluster.accel.disable``)."""
    if _INSTALLED:
        return
    from pyinfra.api.host import Host

    real = Host.connect

    def connect(self, *args, **kwargs):
        if self.connected:
            return real(self, *args, **kwargs)  # pyinfra's own no-op
        lock = self.__dict__.get("_aicluster_connect_lock")
        if lock is None:
            import gevent.lock

            lock = self.__dict__.setdefault("_aicluster_connect_lock", gevent.lock.RLock())
        with lock:
            if self.connected:  # another reader connected it while this one waited
                return None
            return real(self, *args, **kwargs)

    connect.aicluster_connect_once = True  # type: ignore[attr-defined]
    connect.__doc__ = real.__doc__
    PATCHES.replace(Host, "connect", connect)
    _INSTALLED.append(True)
