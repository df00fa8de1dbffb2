"""Switching some GPUs to another profile while the others keep theirs (the daemon's rules).

``switch`` plans each target profile on one snapshot, keeps the changes of the GPUs being switched,
and adds, for every setting the GPU's old profile set and its new one does not mention, a write of
that setting's original (so a rule's locked clocks do not outlive the rule). Then one
``engine.apply``: the state file, with every GPU's desired settings and the originals from before
any profile (an apply only adds originals not yet recorded), is saved before the first write, so a
daemon killed mid-switch is undone by ``gpud restore``; a failed write rolls back this switch's
writes. A GPU switched to no profile (no base profile configured) ends with no desired settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import Snapshot
from gpud.profiles import engine
from gpud.profiles import state as st
from gpud.profiles.engine import ORDER, Change, Desired, Outcome
from gpud.profiles.profile import Profile
from gpud.profiles.settings import BY_KEY, UNSUPPORTED, At, Gpu

RULES_KEY = "rules"  # the state file's record of the GPUs a rule switched: GPU → {profile, rule}


def blank(base: Profile | None) -> Profile:
    """The profile the state file names: the base profile, or an empty one (no base configured)."""
    return base if base is not None else Profile("", "", "", {}, (), {})


def switched(machine: Machine) -> dict[int, dict[str, str]]:
    """The GPUs a rule switched, as the state file records them (GPU → profile, rule)."""
    data = engine.read_state(machine)
    raw = data.extra.get(RULES_KEY) if data is not None else None
    if not isinstance(raw, dict):
        return {}
    return {int(k): dict(v) for k, v in raw.items() if str(k).isdigit() and isinstance(v, dict)}


def switch(machine: Machine, base: Profile | None, targets: Mapping[int, Profile | None],
           rules: Mapping[int, dict[str, str]], snap: Snapshot | None = None) -> tuple[Outcome, Desired]:
    """Switch each GPU of ``targets`` to its profile (None: none at all); ``rules`` is the state file's
    new record of the GPUs a rule holds. Returns the outcome and every GPU's desired settings after it."""
    snap = snap if snap is not None else machine.snapshot()
    data = engine.read_state(machine)
    old = data.gpu_desired() if data is not None else {}
    originals = {t.index: v for t, v in st.by_target(data.originals if data is not None else {}).items()
                 if isinstance(t, Gpu)}
    merged: Desired = {g: dict(v) for g, v in old.items()}
    changes: list[Change] = []
    plans: dict[str, tuple[list[Change], Desired]] = {}
    for gpu, profile in targets.items():
        if profile is None:
            merged.pop(gpu, None)
            continue
        if profile.source not in plans:
            plans[profile.source] = engine.plan(machine, profile, snap=snap)
        planned, desired = plans[profile.source]
        merged[gpu] = dict(desired.get(gpu, {}))
        changes += [c for c in planned if c.gpu == gpu]
    samples = {s.index: s for s in snap.samples}
    for gpu in targets:
        now = merged.get(gpu, {})
        for key, was in old.get(gpu, {}).items():
            if key in ("required", "fan") or key in now or was == UNSUPPORTED or key not in originals.get(gpu, {}):
                continue  # fans: the fan loop hands a fan no profile drives back to the driver
            back = originals[gpu][key]
            s = samples.get(gpu)
            setting = BY_KEY[key]
            current = (setting.read(At(machine, Gpu(gpu), None, s), engine.typed(setting, was))
                       if s is not None and not s.lost else None)
            changes.append(Change(gpu, key, setting.to_json(current), back, "set",
                                  "the rule's profile set it: original back", original=back,
                                  undo=setting.undo(current)))
    changes.sort(key=lambda c: (-1 if c.gpu is None else c.gpu, ORDER.index(c.setting) if c.setting in ORDER else 0))
    extra: dict[str, Any] = {RULES_KEY: {str(g): dict(r) for g, r in sorted(rules.items())}} if rules else {}
    out = engine.apply(machine, blank(base), changes, merged, extra=extra)
    if not out.ok:
        return out, old
    return out, engine.unsupported_removed(merged, out)


def drop_if_empty(machine: Machine) -> None:
    """After every GPU went back to no profile (none configured): nothing is applied, the record goes
    (the originals were written back by the switch)."""

    data = engine.read_state(machine)
    if data is not None and not data.profile and not data.gpu_desired() and not data.desired.get("host") \
            and not data.extra.get(RULES_KEY):
        why = st.clear()
        if why:
            raise GpudError(why)


__all__ = ["RULES_KEY", "blank", "drop_if_empty", "switch", "switched"]
