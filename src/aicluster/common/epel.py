"""EPEL on EL9 (Rocky, Alma, RHEL) as EPEL's own instructions set it up: CodeReady
Builder (CRB) enabled first, since some EPEL packages need packages from it, then
``epel-release``. Engine-free: the pyinfra deploys (the ``CrbEnabled`` fact,
``aicluster.common.ops.enable_crb_for``), the Ansible roles (the same commands, handed
to them as derived values) and the NVIDIA installer script use these same texts.

CRB is the ``crb`` repository on Rocky, Alma and CentOS Stream 9 (``dnf config-manager
--set-enabled crb``, from dnf-plugins-core); RHEL's is
``codeready-builder-for-rhel-9-<arch>-rpms``, enabled through subscription-manager by
the site (read as enabled here; the enable command has no ``crb`` to enable there).
"""

from __future__ import annotations

from collections.abc import Iterable

#: The package that adds EPEL's repository (in Rocky's and Alma's extras repository).
EPEL_PACKAGE = "epel-release"

#: Prints ``yes`` when CRB is enabled, else ``no``: an ``enabled=1`` (or true/yes) line
#: in a ``[crb]`` or ``[codeready-builder-for-rhel-<N>-<arch>-rpms]`` section of a
#: ``/etc/yum.repos.d/*.repo`` file. Read from the files, so it never waits on a mirror
#: (dnf would load repository metadata).
CRB_STATE_COMMAND = (
    "awk 'FNR == 1 { s = \"\" } "
    "/^[ \\t]*\\[/ { s = $0; gsub(/[][ \\t\\r]/, \"\", s); next } "
    "(s == \"crb\" || s ~ /^codeready-builder-for-rhel-[0-9]+-[^-]+-rpms$/) "
    "&& /^[ \\t]*enabled[ \\t]*=/ { v = $0; sub(/^[^=]*=[ \\t]*/, \"\", v); "
    "sub(/[ \\t\\r]*$/, \"\", v); if (v ~ /^(1|[Tt]rue|[Yy]es)$/) f = 1 } "
    "END { print (f ? \"yes\" : \"no\") }' /etc/yum.repos.d/*.repo 2>/dev/null || true"
)

#: Enables CRB (dnf config-manager is dnf-plugins-core's).
CRB_ENABLE_COMMAND = "dnf -y install dnf-plugins-core && dnf config-manager --set-enabled crb"

#: CRB, then EPEL: what the NVIDIA installer runs before the driver (dkms is EPEL's).
EPEL_COMMAND = f"{CRB_ENABLE_COMMAND} && dnf -y install {EPEL_PACKAGE}"


def needs_crb(packages: Iterable[str]) -> bool:
    """Whether installing ``packages`` (on EL9) installs EPEL, so CRB comes first."""
    return EPEL_PACKAGE in packages

