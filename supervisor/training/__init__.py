"""Training and demos: the simulator demo and narrated drills."""
