"""Build minimal simulated workstations and run one doctor check on them."""

from __future__ import annotations

from pathlib import Path

from gpud.backends import open_machine
from gpud.config import Config, parse
from gpud.doctor import Report, diagnose
from gpud.model import CheckResult


def description(n: int = 1, model: str = "RTX A6000", machine: str = "", defaults: str = "", extra: str = "",
                numa: list[int] | None = None, gpu_extra: dict[int, str] | None = None) -> str:
    gpus = []
    for i in range(n):
        bus = 0x17 + i * 0x20
        gpus.append(f'[[gpu]]\nbus_id = "0000:{bus:02x}:00.0"\nroot_port = "0000:{bus - 1:02x}:01.0"\n'
                    f"numa_node = {(numa or [0] * n)[i]}\n{(gpu_extra or {}).get(i, '')}\n")
    return (f'[machine]\nname = "t{n}"\nvendor_model = "HP Z8 Fury G5 Workstation Desktop PC"\n{machine}\n'
            f'[gpu_defaults]\nmodel = "{model}"\n{defaults}\n' + "".join(gpus) + extra)


def doctor(tmp_path: Path, check: str, text: str, *, env: dict[str, str] | None = None,
           config: dict | None = None, expect_gpus: int | None = None, before=None,
           profile: dict | None = None) -> Report:
    p = tmp_path / "box.toml"
    p.write_text(text)
    m = open_machine(str(p))
    if before is not None:
        before(m)
    conf = parse(config, "test.toml") if config else Config()
    return diagnose(m, conf, only=[check], env=env or {}, expect_gpus=expect_gpus)


def statuses(report: Report) -> list[tuple[str, int | None]]:
    return [(r.status, r.gpu) for r in report.checks]


def only(report: Report) -> CheckResult:
    assert len(report.checks) == 1, report.checks
    return report.checks[0]
