"""How long one operation that waits on the network may take on a host, and how often it
is retried, so one hung mirror fails that host by name instead of stalling all (both
engines: pyinfra's operation arguments, Ansible's task timeout and retries)."""

NETWORK_TIMEOUT = 900
NETWORK_RETRIES = 2
