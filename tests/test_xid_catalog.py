"""The Xid policy is NVIDIA's Xid catalog (gpud.doctor.xid cites the revision): each Xid's resolution
bucket, judged through gpud.doctor.health's assessment (what the Slurm prolog uses: unfit when anything
is unhealthy); and the NVML library missing (a container without the NVIDIA runtime) is no reboot."""

from __future__ import annotations

import time

import pytest

from gpud.config import HealthSection
from gpud.doctor import health as hl
from gpud.doctor import xid
from gpud.errors import LibraryNotFound
from gpud.model import CheckResult, GpuInfo, GpuSample, Snapshot, Versions, XidEvent

GPU = GpuInfo(0, "GPU-a", "RTX A6000", None, "0000:17:00.0", None, "ampere", None, None, 4, 16, 300.0, 100.0,
              300.0, 95, 98, {}, 1, 30, 100, 0, 0, (0,))
# The catalog's RESTART_APP Xids named in issue 37 (87 is not among them: the catalog lists it Unused,
# CONTACT_SUPPORT), and the rest of the catalog's RESTART_APP rows.
RESTART_APP = (32, 39, 40, 41, 60, 69, 70, 71, 72, 80, 82, 83, 84, 85, 86, 88, 89, 94)


def snap() -> Snapshot:
    return Snapshot(time.time(), Versions("550", "12.4", "12.550"), (GPU,), (GpuSample(0, "GPU-a", time.time()),))


def assess(*xids: int, section: HealthSection | None = None,
           checks: tuple[CheckResult, ...] = ()) -> tuple[hl.Health, ...]:
    now = time.time()
    return hl.assess(checks, snap(), xids=[XidEvent("0000:17:00.0", x, f"Xid {x}", 100.0) for x in xids],
                     boot_time=now - 1000, boot_id="b", history=[], policy=hl.policy_of(section or HealthSection()))


def component(states: tuple[hl.Health, ...], name: str, gpu: int | None = 0) -> hl.Health:
    return next(h for h in states if h.gpu == gpu and h.component == name)


def test_xid_92_high_single_bit_ecc_rate_is_not_unhealthy() -> None:
    states = assess(92)
    h = component(states, "xid")
    assert xid.XIDS[92].bucket == "IGNORE"
    assert h.state != "unhealthy" and h.action == "none" and hl.worst_of(states) != "unhealthy"


@pytest.mark.parametrize("x", RESTART_APP)
def test_a_catalog_restart_app_xid_is_the_applications_not_the_nodes(x: int) -> None:
    states = assess(x)
    h = component(states, "xid")
    assert xid.XIDS[x].bucket == "RESTART_APP"
    assert (h.state, h.action) == ("degraded", "check the application")
    assert hl.worst_of(states) != "unhealthy"  # the prolog leaves the node fit: no drain


def test_every_restart_app_row_of_the_catalog_leaves_the_node_fit() -> None:
    rows = [row[0] for row in xid.CATALOG if row[3] == "RESTART_APP"]
    assert len(rows) > len(RESTART_APP)
    assert all(hl.worst_of(assess(x)) != "unhealthy" for x in rows)


def test_24_and_30_are_not_application_xids() -> None:
    policy = hl.policy_of(HealthSection())
    for x in (24, 30):
        assert policy.kind(x) != "application" and x not in hl.default_application_xids()
        assert "unused" in xid.describe(x).meaning.lower()  # the catalog: Unused on Ampere and newer


@pytest.mark.parametrize("x,bucket,words", [(136, "RESET_GPU", "link training"), (143, "RESET_GPU", "initialization"),
                                            (155, "RESET_GPU", "sw defined"), (156, "RESET_GPU", "retirement event"),
                                            (157, "IGNORE", "retirement failure"), (158, "RESET_GPU", "fatal timeout")])
def test_new_xids_have_their_own_meaning_and_bucket(x: int, bucket: str, words: str) -> None:
    d = xid.describe(x)
    assert d.kind != "unknown" and "catalog" not in d.meaning.lower() and words in d.meaning.lower()
    assert d.bucket == bucket
    h = component(assess(x), "xid")
    assert h.state == ("unhealthy" if bucket == "RESET_GPU" else "degraded")
    assert h.action == hl.BUCKET_ACTION[d.bucket]


def test_every_xid_in_the_table_has_a_bucket_and_a_source() -> None:
    assert [row[0] for row in xid.CATALOG] == list(range(1, 173))  # every Xid the catalog lists
    for x, d in xid.XIDS.items():
        assert d.bucket in xid.BUCKETS and d.bucket in hl.BUCKET_ACTION, x
        assert d.source and d.meaning and d.action, x
    assert "analyzing-xid-catalog" in (xid.__doc__ or "") and "R575" in (xid.__doc__ or "")


def test_ignore_xids_are_never_unhealthy_and_the_quiet_ones_are_healthy_with_a_note() -> None:
    for x, d in xid.XIDS.items():
        if d.bucket == "IGNORE":
            h = component(assess(x), "xid")
            assert h.state in ("healthy", "degraded") and h.action == "none", x
    h = component(assess(63), "xid")
    assert h.state == "healthy" and "Xid 63" in h.reason


def test_reset_reboot_and_inspect_buckets_are_unhealthy() -> None:
    for x, action in ((48, "reset the GPU"), (109, "reset the GPU"), (79, "reboot"), (54, "inspect the hardware"),
                      (142, "inspect the hardware")):
        h = component(assess(x), "xid")
        assert (h.state, h.action) == ("unhealthy", action), x


def test_an_override_in_health_still_wins() -> None:
    # the lab's list replaces the catalog's RESTART_APP whole: listed is the application's, unlisted is a reset
    section = HealthSection(application_xids=[92, 48])
    assert (component(assess(48, section=section), "xid").action) == "check the application"
    strict = HealthSection(application_xids=[13])
    h = component(assess(32, section=strict), "xid")
    assert (h.state, h.action) == ("unhealthy", "reset the GPU")


def test_nvml_library_not_found_names_the_container_runtime_not_a_reboot() -> None:
    import pynvml

    from gpud.hw.nvml import NvmlClient

    err = NvmlClient(pynvml).translate(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), "nvmlInit", None)
    assert isinstance(err, LibraryNotFound) and "runtime" in err.remedy and "libnvidia-ml" in err.remedy
    check = CheckResult("nvml.available", "fail", str(err), None, remedy=err.remedy)
    driver = component(assess(checks=(check,)), "driver", None)
    assert driver.action != "reboot" and "NVIDIA runtime" in driver.remedy
