"""What the daemon tells: the status HTTP server, Prometheus metrics, systemd notify, logs."""
