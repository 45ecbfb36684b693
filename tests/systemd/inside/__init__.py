"""Scripts the systemd tier runs inside its container with Debian's python (standard library only)."""
