"""The simulator reaches itself as SGLang does (`ServerArgs.url()`) and prints its address as uvicorn does."""

from __future__ import annotations

import pytest

from simulator.cli import parse_server_args


@pytest.mark.parametrize(
    ("host", "url", "printed"),
    [
        ("127.0.0.2", "http://127.0.0.2:31000", "http://127.0.0.2:31000"),
        ("0.0.0.0", "http://127.0.0.1:31000", "http://0.0.0.0:31000"),
        ("::", "http://[::1]:31000", "http://[::]:31000"),
        ("::1", "http://[::1]:31000", "http://[::1]:31000"),
    ],
)
def test_own_url_and_printed_address(host: str, url: str, printed: str) -> None:
    """A wildcard host is reached at the loopback of its family; IPv6 addresses go in brackets."""
    args = parse_server_args(["--model-path", "m", "--host", host, "--port", "31000"])
    assert args.url() == url and args.listen_url() == printed
