"""The testbed's one exception type."""

from __future__ import annotations

import click


class TestbedError(click.ClickException):
    """A testbed operation failed; the CLI prints the message and exits with status 2.

    Being a :class:`click.ClickException`, it needs no handling in the CLI, and the
    Python API (``up()``, ``down()``, ``status()``) raises it as a plain exception.
    """

    __test__ = False  # not a pytest test class, despite the name
    exit_code = 2
