"""What each Xid means and what to do (after NVIDIA's Xid catalog and DCGM's health watches).

``hardware`` Xids (GPU, memory, links, firmware, driver) fail a pre-flight; ``application`` ones
(the usual fallout of a crashing program) warn.
"""

from __future__ import annotations

from typing import NamedTuple


class Xid(NamedTuple):
    kind: str  # hardware | application
    meaning: str
    action: str


RESET = "drain the GPU and reset it (`sudo nvidia-smi -r -i N`) or reboot"
XIDS: dict[int, Xid] = {
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


def describe(xid: int) -> Xid:
    return XIDS.get(xid, Xid("unknown", "see NVIDIA's Xid catalog", "look it up in NVIDIA's Xid catalog; "
                                                                     "if it recurs, " + RESET))
