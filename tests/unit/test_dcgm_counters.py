"""dcgm-exporter's counters file (roles/monitoring/files/dcgm-counters.csv) against the
alert pack: every DCGM metric a rule reads is a row of the file (dcgm-exporter serves
only the fields its CSV names), every row has dcgm-exporter's three fields."""

from __future__ import annotations

import re

from aicluster.components.monitoring.derive import DCGM_COUNTERS_SOURCE, RULES_SOURCE

TYPES = {"gauge", "counter", "label"}


def _rows() -> list[list[str]]:
    rows = []
    for line in DCGM_COUNTERS_SOURCE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            rows.append([f.strip() for f in line.split(",")])
    return rows


def test_every_row_is_field_type_help():
    for row in _rows():
        assert len(row) == 3, row  # a comma in the help text would make a fourth field
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", row[0]), row
        assert row[1] in TYPES, row


def test_every_dcgm_metric_the_rules_read_is_listed():
    listed = {row[0] for row in _rows()}
    read = set()
    for path in RULES_SOURCE.glob("*.yml"):
        read |= set(re.findall(r"\b(DCGM_(?:FI|EXP)_[A-Z0-9_]*[A-Z0-9])\{job=", path.read_text()))
    assert read, "the alert pack reads no DCGM metric"
    assert read <= listed, sorted(read - listed)


def test_what_the_issue_asks_for_is_listed():
    listed = {row[0] for row in _rows()}
    for name in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                 "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                 "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
                 "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT",
                 "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL",
                 "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        assert name in listed, name
