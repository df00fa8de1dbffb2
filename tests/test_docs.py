"""docs/simulation.md is complete enough to describe a machine from its text alone."""

from __future__ import annotations

import re

from conftest import REPO

from gpud.backends import open_machine


def _example() -> str:
    text = (REPO / "docs" / "simulation.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert blocks, "docs/simulation.md has no TOML example"
    return blocks[-1]


def test_a_description_written_from_the_docs_loads_and_runs(tmp_path) -> None:
    p = tmp_path / "my-tower.toml"
    p.write_text(_example())
    m = open_machine(str(p))
    snap = m.snapshot()
    assert len(snap.samples) == 2
    assert snap.samples[1].pcie_width == 8
    assert snap.samples[0].processes[0].user == "bob"
    assert m.topology(snap).level[0][1] == "NV4"
    assert [e.xid for e in m.host.xid_events()] == [79]
    assert m.host.cpu_info().model.startswith("AMD Ryzen Threadripper PRO")


def test_every_description_key_is_documented() -> None:
    from gpud.sim.description import GPU_KEYS, MACHINE_KEYS, MODEL_KEYS, XORG_KEYS
    from gpud.sim.faults import FAULT_KEYS

    doc = (REPO / "docs" / "simulation.md").read_text()
    for key in [*MACHINE_KEYS, *GPU_KEYS, *MODEL_KEYS, *XORG_KEYS, *FAULT_KEYS]:
        assert f"`{key}`" in doc, f"{key} is not documented in docs/simulation.md"
