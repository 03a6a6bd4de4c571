"""pyinfra's configuration file: pyinfra runs it (from the directory it is started in)
before it loads the inventory. aicluster validates the inventory here, with the
command's ``--data`` overrides, so that every mistake in it, a SyntaxError included,
is reported as the other entry points report it (``file:line: message``, every problem
named, exit status 2) before pyinfra connects to any host
(``aicluster.inventory.pyinfra_check``; the inventory file itself does the same when
pyinfra is started elsewhere).
"""

from aicluster.inventory import pyinfra_check

pyinfra_check()
