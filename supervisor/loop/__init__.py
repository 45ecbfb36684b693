"""The per-server control loop: observe, triage, act."""
