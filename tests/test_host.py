"""gpud.hw.host on hand-made trees and on the simulator's tree."""

from __future__ import annotations

import math
import os
from pathlib import Path

from gpud.backends import open_machine
from gpud.hw.host import Host, acs_capability, parse_size


def _w(root: Path, rel: str, text: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)


def test_missing_files_give_none_or_empty(tmp_path: Path) -> None:
    h = Host(tmp_path)
    assert h.kernel_cmdline() is None
    assert h.loaded_modules() == frozenset()
    assert h.xorg_options() == [] and h.xorg_log() == []
    assert h.pci_devices() == [] and h.cpu_governors() == {}
    assert h.memory_total_bytes() is None and h.memlock_bytes() is None
    assert h.kernel_log() is None and h.xid_events() is None
    assert h.iommu()["enabled"] is False


def test_xorg_options_with_file_line_and_section(tmp_path: Path) -> None:
    _w(tmp_path, "etc/X11/xorg.conf", 'Section "Screen"\n  Identifier "S0"\n  # Option "SLI" "on"\n'
       '  Option "SLI" "Mosaic"\n  SubSection "Display"\n  EndSubSection\n  Option "BaseMosaic"\nEndSection\n')
    _w(tmp_path, "etc/X11/xorg.conf.d/20-gpu.conf", 'Section "Device"\n option "MultiGPU" "on" # legacy\nEndSection\n')
    opts = Host(tmp_path).xorg_options()
    assert [(o.file, o.line, o.section, o.name, o.value) for o in opts] == [
        ("/etc/X11/xorg.conf", 4, "Screen", "SLI", "Mosaic"),
        ("/etc/X11/xorg.conf", 7, "Screen", "BaseMosaic", None),
        ("/etc/X11/xorg.conf.d/20-gpu.conf", 2, "Device", "MultiGPU", "on"),
    ]


def test_kmsg_records_and_xids(tmp_path: Path) -> None:
    _w(tmp_path, "dev/kmsg", "6,1,4200000,-;nvidia: loading\n"
       "4,2,73412500000,-;NVRM: Xid (PCI:0000:7c:00): 48, pid=1, name=python, An uncorrectable double bit error\n"
       "4,3,80000000000,-;NVRM: Xid (PCI:0000:16:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off.\n")
    ev = Host(tmp_path).xid_events()
    assert [(e.pci_bus_id, e.xid, e.seconds_since_boot) for e in ev] == [
        ("0000:7c:00.0", 48, 73412.5), ("0000:16:00.0", 79, 80000.0)]
    assert "fallen off" in ev[1].text


def test_kern_log_fallback(tmp_path: Path) -> None:
    _w(tmp_path, "var/log/kern.log", "Nov 29 10:00:00 z8 kernel: NVRM: Xid (PCI:0000:38:00): 13, Graphics Exception\n")
    ev = Host(tmp_path).xid_events()
    assert ev[0].xid == 13 and ev[0].seconds_since_boot is None


def test_acs_capability_parsing() -> None:
    cfg = bytearray(4096)
    cfg[0x100:0x104] = (0x0001 | (1 << 16) | (0x140 << 20)).to_bytes(4, "little")  # AER → next at 0x140
    cfg[0x140:0x144] = (0x000D | (1 << 16)).to_bytes(4, "little")
    cfg[0x146:0x148] = (0x1D).to_bytes(2, "little")
    assert acs_capability(bytes(cfg)) == (True, 0x1D)
    assert acs_capability(bytes(256)) == (None, None)  # not root: only the first 256 bytes are readable
    assert acs_capability(bytes(4096)) == (False, None)  # readable, and no ACS capability: not "unreadable"


def test_sizes() -> None:
    assert parse_size("64m") == 64 << 20
    assert parse_size("65536k") == 64 << 20
    assert parse_size("50%", 1000) == 500
    assert parse_size("x") is None


def test_simulated_tree_reads_like_a_real_one() -> None:
    m = open_machine("z8-fury-4x-a6000-degraded")
    h = m.host
    gpus = h.nvidia_gpus()
    assert [g.address for g in gpus] == ["0000:16:00.0", "0000:38:00.0", "0000:5a:00.0", "0000:7c:00.0"]
    g2 = gpus[2]
    assert (g2.current_link_width, g2.max_link_width) == (8, 16)
    assert g2.parents == ("0000:59:01.0",) and g2.driver == "nvidia"
    port = h.pci_device(g2.parents[0])
    assert port is not None and port.acs_ctrl == 0x1D
    assert set(h.cpu_governors().values()) == {"powersave"} and len(h.cpu_governors()) == 112
    assert h.shm_bytes() == 64 << 20
    assert h.memlock_bytes() == math.inf
    assert h.memory_total_bytes() == 512 << 30
    cpu = h.cpu_info()
    assert (cpu.sockets, cpu.cores, cpu.threads, cpu.numa_nodes) == (1, 56, 112, 1)
    assert "w9-3495X" in cpu.model
    assert [(e.pci_bus_id, e.xid) for e in h.xid_events()] == [("0000:7c:00.0", 48)]
    assert "nvidia" in h.loaded_modules() and "nouveau" not in h.loaded_modules()
    assert h.process(48213) == ("alice", "python train_resnet.py --gpu 1")
    assert h.product_name() == "HP Z8 Fury G5 Workstation Desktop PC"
    assert h.cpu_power_limit_watts() == 350
    assert h.x_displays() == [] and h.nvidia_settings_query("SLIMode") is None


def test_switch_and_iommu_in_the_server_tree() -> None:
    h = open_machine("2s-8x-a6000").host
    g0 = h.pci_device("0000:1b:00.0")
    assert g0 is not None and g0.parents == ("0000:17:02.0", "0000:18:00.0", "0000:19:00.0")
    io = h.iommu()
    assert io["enabled"] and io["passthrough"] and io["domain_types"] == ["identity"]
    assert h.cpu_info().sockets == 2


def test_sli_description_has_xorg_file_and_log() -> None:
    h = open_machine("z8-g4-2x-rtx8000-sli").host
    sli = [o for o in h.xorg_options() if o.name.lower() == "sli"]
    assert sli and sli[0].file == "/etc/X11/xorg.conf" and sli[0].value == "On"
    assert any("SLI is enabled" in line for _, _, line in h.xorg_log())


def test_real_root_does_not_crash() -> None:
    h = Host("/")
    h.kernel_cmdline(), h.loaded_modules(), h.pci_devices(), h.iommu(), h.cpu_info()
    h.cpu_governors(), h.shm_bytes(), h.memlock_bytes(), h.memory_total_bytes(), h.xid_events()
    assert h.process(os.getpid())[1]
