"""What the daemon remembers: incidents, the incident journal, state.json."""
