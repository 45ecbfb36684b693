"""Where a server listens (`--host`) and where the probes reach it: SGLang's own rules for its address."""

from __future__ import annotations

import pytest

from policies.pd import Role
from supervisor.config.models import ServerConfig
from supervisor.host.preflight import port_addresses


def server(*args: str, role: Role = Role.UNIFIED) -> ServerConfig:
    return ServerConfig(name="s", role=role, command=("python",), args=("--model-path", "m", *args))


@pytest.mark.parametrize(
    ("args", "url"),
    [
        ((), "http://127.0.0.1:30000"),
        (("--port", "31000"), "http://127.0.0.1:31000"),
        (("--host", "127.0.0.2", "--port", "31000"), "http://127.0.0.2:31000"),
        (("--host=10.1.2.3",), "http://10.1.2.3:30000"),
        (("--host", "0.0.0.0"), "http://127.0.0.1:30000"),
        (("--host", "::"), "http://[::1]:30000"),
        (("--host", "::1", "--port", "31000"), "http://[::1]:31000"),
        (("--host", "[::1]"), "http://[::1]:30000"),
        (("--host", "2001:db8::5"), "http://[2001:db8::5]:30000"),
        (("--host", "gpu-7.internal"), "http://gpu-7.internal:30000"),
        (("--host", "127.0.0.2", "--host", "127.0.0.3"), "http://127.0.0.3:30000"),
    ],
)
def test_base_url_is_the_address_the_server_listens_on(args: tuple[str, ...], url: str) -> None:
    """`--host` as SGLang reads it; a wildcard is the loopback of its family; IPv6 in brackets."""
    assert server(*args).base_url == url


def test_a_routers_host_is_read_too() -> None:
    """The router's `--host` (its own command line) is where its probes go."""
    router = server("--host", "127.0.0.5", "--port", "8000", role=Role.ROUTER)
    assert router.base_url == "http://127.0.0.5:8000"


def test_the_port_checks_bind_the_http_port_where_the_server_will() -> None:
    """The HTTP port is checked at `--host` (a wildcard as itself), the extra ports at loopback."""
    assert port_addresses(server("--port", "31000")) == {"127.0.0.1": [31000]}
    spread = ServerConfig(
        name="s", command=("python",), args=("--host", "::", "--port", "31000"), ports=(31002, 31001)
    )
    assert port_addresses(spread) == {"::": [31000], "127.0.0.1": [31001, 31002]}
    assert port_addresses(server("--host", "[::1]")) == {"::1": [30000]}
