"""Filters the monitoring role uses: the very Python the pyinfra deploy runs, so both
engines decide alike."""

from __future__ import annotations

from aicluster.common.minio_credentials import metrics_token
from aicluster.common.versions import version_matches
from aicluster.components.monitoring.derive import grafana_admin_password


def aicluster_monitoring_version_matches(installed, wanted):
    """Whether any installed version of a package is the pinned one (an empty pin: any)."""
    versions = [installed] if isinstance(installed, str) else list(installed or [])
    return any(version_matches(str(v), str(wanted or "")) for v in versions)


def aicluster_monitoring_grafana_password(ref, name, size, check_mode=False):
    """Grafana's admin password, read (a missing secret file generated, except in check
    mode) on the deploying machine: the tasks that use it have no_log."""
    return grafana_admin_password(ref, name, int(size), dry=bool(check_mode))


def aicluster_monitoring_minio_token(entry, check_mode=False):
    """MinIO's metrics token for a ``monitoring_secret_files`` entry of kind "minio_token"
    (derive.minio_token_file), minted on the deploying machine from MinIO's root user and
    root password (its secret generated there first, except in check mode): the function
    the pyinfra deploy calls (derive.secret_text). The task that uses it has no_log."""
    return metrics_token(entry["ref"], entry["secret"], int(entry["bytes"]), entry["user"],
                         dry=bool(check_mode))


class FilterModule:
    def filters(self):
        return {"aicluster_monitoring_minio_token": aicluster_monitoring_minio_token,
                "aicluster_monitoring_version_matches": aicluster_monitoring_version_matches,
                "aicluster_monitoring_grafana_password": aicluster_monitoring_grafana_password}
