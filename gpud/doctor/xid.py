"""What each Xid means and what to do (after NVIDIA's Xid catalog and DCGM's health watches).

Sources: NVIDIA, "Xid Errors" (docs.nvidia.com/deploy/xid-errors/, the table of Xids with their
causes) and "Analyzing Xid Errors with the Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html: mnemonic, description and resolution bucket per Xid, Ampere and newer).
Xids the catalog marks "Unused" are left out; an Xid not listed is ``unknown``.

``hardware`` Xids (GPU, memory, links, firmware, driver) fail a pre-flight; ``application`` ones
(the usual fallout of a crashing program) warn. The application ones agree with the catalog's
RESTART_APP bucket and with the Kubernetes device plugin's list of application Xids (13, 31, 43, 45,
68, 109; NVIDIA/k8s-device-plugin ``internal/rm/health.go``). ``gpud.doctor.health`` takes the
list from ``[health] application_xids`` where the lab sets one.
"""

from __future__ import annotations

from typing import NamedTuple


class Xid(NamedTuple):
    kind: str  # hardware | application
    meaning: str
    action: str


RESET = "drain the GPU and reset it (`sudo nvidia-smi -r -i N`) or reboot"
APP = "restart the program; if it recurs with other programs, test the GPU"
DRIVER = f"update the driver; {RESET}"
INSPECT = "inspect the hardware: the same hardware Xid came back after a reboot (`gpud events --dossier GPU`)"
XIDS: dict[int, Xid] = {
    8: Xid("application", "GPU stopped processing (channel idle timeout)", APP),
    11: Xid("application", "invalid or corrupted push buffer stream", APP),
    16: Xid("hardware", "display engine hung", DRIVER),
    18: Xid("hardware", "bus mastering disabled in PCI config space", "check the slot and the kernel's PCI messages; "
            + RESET),
    19: Xid("hardware", "display engine error", DRIVER),
    24: Xid("application", "GPU semaphore timeout", APP),
    25: Xid("application", "invalid or illegal push buffer stream", APP),
    26: Xid("hardware", "framebuffer timeout", DRIVER),
    27: Xid("hardware", "video processor exception", DRIVER),
    28: Xid("hardware", "video processor exception", DRIVER),
    29: Xid("hardware", "video processor exception", DRIVER),
    30: Xid("application", "GPU semaphore access error", APP),
    32: Xid("hardware", "invalid or corrupted push buffer stream (DMA controller fault: PCIe bus quality)",
            "check the PCIe link (`gpud doctor --check 'pcie.*'`), riser and seating; " + RESET),
    38: Xid("hardware", "driver firmware error", DRIVER),
    42: Xid("hardware", "video processor exception", DRIVER),
    44: Xid("hardware", "graphics engine fault during context switch", DRIVER),
    46: Xid("hardware", "GPU stopped processing", DRIVER),
    54: Xid("hardware", "auxiliary power is not connected to the GPU board", "connect the board's power cables "
            "(8-pin / 12VHPWR) and check the supply"),
    58: Xid("hardware", "unstable video memory interface detected", f"{RESET}; check cooling; if it recurs, RMA"),
    59: Xid("hardware", "internal micro-controller error", DRIVER),
    60: Xid("hardware", "video processor exception", DRIVER),
    65: Xid("hardware", "video processor exception", DRIVER),
    66: Xid("hardware", "illegal access by driver", DRIVER),
    67: Xid("hardware", "illegal access by driver", DRIVER),
    68: Xid("application", "video decoder (NVDEC) exception", APP),  # the device plugin's application list
    73: Xid("hardware", "video encoder (NVENC) error", DRIVER),
    80: Xid("hardware", "corrupted data sent to the GPU", "check the PCIe link, riser and seating; " + RESET),
    81: Xid("hardware", "VGA subsystem error", DRIVER),
    109: Xid("application", "context switch timeout", APP),
    121: Xid("hardware", "C2C (chip-to-chip) link error", RESET),
    154: Xid("hardware", "GPU recovery action changed (the driver asks for a reset, a reboot or a drain)",
             "do the recovery action the kernel log line names"),
    13: Xid("application", "graphics engine exception", "usually a program bug (illegal access): rerun it under "
            "compute-sanitizer; if it recurs with other programs, test the GPU"),
    31: Xid("application", "GPU memory page fault", "a program used a bad address: debug it with compute-sanitizer"),
    43: Xid("application", "GPU stopped processing after a program's fault", "nothing to do unless it recurs"),
    45: Xid("application", "preemptive clean-up after a program was killed or faulted",
            "informational: follows a crash or a kill"),
    48: Xid("hardware", "double-bit ECC error (DBE)", f"{RESET}; if it recurs, the board needs replacing (RMA)"),
    56: Xid("hardware", "display engine error", "update the driver; check the display cable"),
    57: Xid("hardware", "error programming video memory interface", f"{RESET}; check cooling and memory clocks"),
    61: Xid("hardware", "internal micro-controller breakpoint", f"{RESET}; update the driver"),
    62: Xid("hardware", "internal micro-controller halt", f"{RESET}; update the driver"),
    63: Xid("hardware", "ECC page retirement or row remapping recorded", f"{RESET} to apply it; watch for Xid 64"),
    64: Xid("hardware", "ECC page retirement or row remapping failed", f"{RESET}; if it recurs, RMA the board"),
    69: Xid("hardware", "graphics engine class error", f"{RESET}; update the driver"),
    74: Xid("hardware", "NVLink error", "reseat the NVLink bridge; read `nvidia-smi nvlink -e`; " + RESET),
    79: Xid("hardware", "GPU has fallen off the bus", "check power cables, seating, riser and slot, and the power "
            "supply; reboot"),
    92: Xid("hardware", "high single-bit ECC error rate", f"watch for DBEs; schedule: {RESET}"),
    94: Xid("hardware", "contained ECC error", "restart the affected program; schedule a GPU reset"),
    95: Xid("hardware", "uncontained ECC error", f"every program on the GPU is affected: {RESET}"),
    119: Xid("hardware", "GSP firmware RPC timeout", f"{RESET}; update the driver"),
    120: Xid("hardware", "GSP firmware error", f"{RESET}; update the driver"),
    140: Xid("hardware", "unrecovered ECC error", f"{RESET}; if it recurs, RMA the board"),
}


def escalated(xid: int, boots: int) -> Xid:
    """A hardware Xid seen on the same GPU in ``boots`` boots: from two on, a reset or reboot has not
    cured it, so the action is to inspect the hardware."""
    d = describe(xid)
    return d._replace(action=INSPECT) if d.kind == "hardware" and boots > 1 else d


def describe(xid: int) -> Xid:
    return XIDS.get(xid, Xid("unknown", "see NVIDIA's Xid catalog", "look it up in NVIDIA's Xid catalog; "
                                                                     "if it recurs, " + RESET))


def unreadable_needs(tried: tuple[tuple[str, str], ...], root: bool) -> list[str]:
    """What gpud needs to read a kernel log, from each source tried and why it failed (``Host.read_xids``'s
    ``KernelLogUnreadable.tried``): /dev/kmsg refused needs root or CAP_SYSLOG (kernel.dmesg_restrict=1,
    Linux ``check_syslog_permissions``); absent, it was not mounted into the container; a syslog file
    refused needs read access (Debian's kern.log is 0640 syslog:adm, RHEL's messages 0600 root); none
    there at all is a journald-only node, where only /dev/kmsg carries the kernel's messages."""
    why = dict(tried)
    needs = []
    kmsg = why.get("/dev/kmsg")
    files = [(p, w) for p, w in tried if p != "/dev/kmsg"]
    if kmsg == "permission denied":
        needs.append("grant CAP_SYSLOG (or `sudo sysctl kernel.dmesg_restrict=0`) to read /dev/kmsg"
                     if root else "run as root (or grant CAP_SYSLOG) to read /dev/kmsg")
    elif kmsg == "absent":
        needs.append("mount /dev/kmsg read-only into the container")
    denied = [p for p, w in files if w == "permission denied"]
    if denied:
        needs.append(f"grant read access to {' or '.join(denied)}" + ("" if root else " (run as root, or join "
                                                                                      "its group, e.g. adm)"))
    if files and all(w == "absent" for _, w in files):
        needs.append("journald-only node: no /var/log/kern.log or /var/log/messages, so /dev/kmsg is the only "
                     "source (gpud does not read the journal)")
    return needs or ["a readable /dev/kmsg"]


def unreadable_summary(tried: tuple[tuple[str, str], ...], root: bool) -> tuple[str, str]:
    """(summary, remedy) of the Xid check and health component when no kernel log could be read:
    "not judged", never "no Xids"."""
    listed = ", ".join(f"{p} {w}" for p, w in tried)
    needs = unreadable_needs(tried, root)
    summary = f"not judged: no kernel log readable ({listed}), Xids unknown; gpud needs: {'; '.join(needs)}"
    return summary, "; ".join(needs)
