"""Reading ``nvidia-smi topo -m``: the GPU-by-GPU matrix, CPU and NUMA affinity."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpud.sim.dump.read import fail, read_capped

# Older drivers printed SOC for SYS and CPU for PHB.
ALIASES = {"SOC": "SYS", "CPU": "PHB"}
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_COLUMN = re.compile(r"GPU\d+|NIC\d+|mlx\d+_\d+|CPU Affinity|NUMA Affinity|GPU NUMA ID")


@dataclass
class Topo:
    file: str
    n: int
    level: dict[tuple[int, int], str] = field(default_factory=dict)  # PIX…SYS or NV<k>, i < j
    line: dict[int, int] = field(default_factory=dict)  # GPU index → its row's line
    cpus: list[list[int] | None] = field(default_factory=list)
    numa: list[int | None] = field(default_factory=list)

    def nvlinks(self, i: int, j: int) -> int:
        lv = self.level[(min(i, j), max(i, j))]
        return int(lv[2:]) if lv.startswith("NV") else 0


def cpu_list(text: str) -> list[int] | None:
    """``0-31,64-95`` → CPU numbers; None for N/A or anything else."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            return None
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a or b - a > 65536:
            return None
        out.extend(range(a, b + 1))
    return out


_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # nvidia-smi underlines the header on a terminal: ESC[4m … ESC[0m


def read_topo(path: Path, file: str) -> Topo:
    text = _ESCAPE.sub("", read_capped(path, file))
    lines = text.split("\n")
    header_at = None
    for k, raw in enumerate(lines):
        if re.match(r"^\s+GPU0(\s|$)", raw.replace("\t", " ")):
            header_at = k
            break
    if header_at is None:
        first = next((k for k, raw in enumerate(lines) if raw.strip()), 0)
        what = ("this is `nvidia-smi -q` output: give it as the first argument"
                if "NVSMI LOG" in text else "not the output of `nvidia-smi topo -m`")
        raise fail(file, first + 1, f"no header line starting with GPU0: {what}")
    columns = _COLUMN.findall(lines[header_at])
    gpu_cols = [c for c in columns if c.startswith("GPU") and c[3:].isdigit()]
    n = len(gpu_cols)
    if gpu_cols != [f"GPU{i}" for i in range(n)]:
        raise fail(file, header_at + 1, f"GPU columns out of order: {' '.join(gpu_cols)}")
    devices = [c for c in columns if c.startswith(("GPU", "NIC", "mlx")) and c != "GPU NUMA ID"]
    extra = [c for c in columns if c in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")]
    topo = Topo(file, n, cpus=[None] * n, numa=[None] * n)
    rows: dict[int, list[str]] = {}
    for k in range(header_at + 1, len(lines)):
        raw = lines[k].strip()
        m = re.match(r"^GPU(\d+)\s", raw + " ")
        if not m:
            if raw.startswith(("NIC", "mlx")) or not raw:
                continue
            break  # the legend
        i = int(m.group(1))
        if i >= n:
            raise fail(file, k + 1, f"row GPU{i} but the header names {n} GPUs")
        if i in rows:
            raise fail(file, k + 1, f"GPU{i} has two rows")
        cells = raw.split()[1:]
        if len(cells) < len(devices):
            raise fail(file, k + 1, f"GPU{i}: {len(cells)} cells for {len(devices)} columns (truncated?)")
        rows[i] = cells
        topo.line[i] = k + 1
        rest = cells[len(devices):]
        for name, value in zip(extra, rest, strict=False):
            if name == "CPU Affinity":
                topo.cpus[i] = cpu_list(value)
            elif name == "NUMA Affinity" and value.isdigit():
                topo.numa[i] = int(value)
    missing = [i for i in range(n) if i not in rows]
    if missing:
        raise fail(file, header_at + 1, f"no row for GPU{missing[0]} (a truncated matrix)")
    for i in range(n):
        for j in range(n):
            cell = ALIASES.get(rows[i][j], rows[i][j])
            if i == j:
                if cell != "X":
                    raise fail(file, topo.line[i], f"GPU{i} against itself is {cell!r}, not X")
                continue
            if cell not in LEVELS and not re.fullmatch(r"NV\d+", cell):
                raise fail(file, topo.line[i], f"GPU{i}–GPU{j}: unknown level {cell!r} "
                                               f"(known: X, {', '.join(LEVELS)}, NV#)")
            other = ALIASES.get(rows[j][i], rows[j][i])
            if other != cell:
                raise fail(file, topo.line[j], f"GPU{j}–GPU{i} is {other} but GPU{i}–GPU{j} is {cell}")
            if i < j:
                topo.level[(i, j)] = cell
    return topo
