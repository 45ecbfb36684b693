"""This daemon's servers in SGLang's gateway (SMG or sglang-router): the `/workers` client and the membership task."""
