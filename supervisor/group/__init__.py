"""Multi-node groups: one SGLang server over several hosts, coordinated through etcd."""
