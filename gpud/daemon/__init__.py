"""The gpud service: tick loop, HTTP exporter, control socket, systemd notifications."""
