"""``gpud tune``: measure which power and clock settings make this machine's training fastest or
cheapest (docs/tune.md). It composes the parts below it and touches no hardware of its own: settings
through the tuning engine (``gpud.profiles``: originals saved first, read back, undone by ``gpud restore``
after a crash), readings through the NVML layer, load through a ``Workload``."""
