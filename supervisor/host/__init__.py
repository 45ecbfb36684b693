"""Effects on the host: launch the tree, watch and reap processes, release and verify GPUs, forensics."""
