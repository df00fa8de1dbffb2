"""The hardware layer: NVML (the only pynvml user) and the host's files under a root path."""
