"""NCCL as the probe sees it: the transport of each channel, read back from NCCL's INFO output, and
the NCCL_* settings the ranks inherit."""

from __future__ import annotations

import os
import re
from typing import Any

TRANSPORT_LINE = re.compile(r"Channel (\d+)(?:/(\d+))? : (\d+)\[([0-9a-fA-Fx]+)\] -> (\d+)\[([0-9a-fA-Fx]+)\]"
                            r"(?: \[(send|receive)\])? via (\S+)")


def parse_nccl_transports(text: str) -> list[dict[str, Any]]:
    """The transport of each channel from NCCL's INFO lines, e.g.
    ``NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC`` (p2p.cc), ``… via SHM/direct/direct`` (shm.cc),
    ``… [send] via NET/Socket/0`` (net.cc), ``… via P2P/CUMEM/read``.

    The bracket after each rank is the GPU: its NVML index (``nvmlDev``) from NCCL 2.18.3 on (commit
    ea383122), its PCI bus id in hex before. The rank is the communicator's: a ``send``/``recv`` pair
    has a two-rank communicator of its own, so only the bracket says which GPUs a line is about."""
    rows, seen = [], set()
    for m in TRANSPORT_LINE.finditer(text):
        channel, _, src, src_dev, dst, dst_dev, direction, via = m.groups()
        key = (int(channel), int(src), src_dev, int(dst), dst_dev, via)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"channel": int(channel), "src_rank": int(src), "dst_rank": int(dst), "src_dev": src_dev,
                     "dst_dev": dst_dev, "transport": via, **({"direction": direction} if direction else {})})
    return rows


def nccl_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every NCCL_* variable of the environment the ranks inherit."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}
