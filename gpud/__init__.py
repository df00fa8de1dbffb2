"""gpud: keeps multi-GPU deep-learning workstations fast and healthy."""

__version__ = "0.1.0"
