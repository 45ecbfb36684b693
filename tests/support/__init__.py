"""Helpers shared by every test tier: ports, deadline polls, HTTP, process scans, the simulator and the daemon."""
