"""A server launched with `--api-key`: the simulator enforces it like SGLang, the probes present it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from policies.model import ProbeSettings
from probes.canary import config_check, tool_canary
from probes.health import probe_health
from probes.progress import scrape_metrics
from tests.support.sim import launched_sim

pytestmark = pytest.mark.hardening

KEY, ADMIN = "sk-probe-key-123", "sk-admin-key-456"
MODEL = "Qwen/Qwen3-8B"
ARGS = ("--model-path", MODEL, "--tool-call-parser", "qwen25", "--enable-metrics")


async def test_probes_present_the_key_and_pass(tmp_path: Path) -> None:
    """Without the key the canaries get 401 and cannot pass; with it in ProbeSettings every probe passes."""
    with launched_sim(tmp_path, *ARGS, "--api-key", KEY, "--admin-api-key", ADMIN) as sim:
        keyless = ProbeSettings(canary_timeout_s=20, expected_tool_parser="qwen25")
        keyed = ProbeSettings(canary_timeout_s=20, expected_tool_parser="qwen25", api_key=KEY)
        async with aiohttp.ClientSession() as session:
            assert (await probe_health(session, sim.base_url, 30)).ok
            samples, error, _ = await scrape_metrics(session, sim.base_url, 10, 2**22)
            assert samples and not error, "/metrics needs no key"
            refused = await tool_canary(session, sim.base_url, MODEL, keyless)
            assert not refused.ok and "401" in refused.detail
            assert not (await config_check(session, sim.base_url, keyless)).ok
            assert (await tool_canary(session, sim.base_url, MODEL, keyed)).ok
            assert (await config_check(session, sim.base_url, keyed)).ok
        assert "api_key=" not in repr(keyed) and KEY not in repr(keyed)


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 20)


def test_simulator_enforces_the_key_like_sglang(tmp_path: Path) -> None:
    """401 `Unauthorized` without the bearer on normal endpoints; /health and /metrics open; admin key on admin paths."""
    with launched_sim(tmp_path, *ARGS, "--api-key", KEY, "--admin-api-key", ADMIN) as sim:
        url = sim.base_url
        assert _get(url + "/health")[0] == 200
        assert _get(url + "/metrics")[0] == 200
        status, body = _get(url + "/v1/models")
        assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
        assert _get(url + "/server_info")[0] == 401
        assert _get(url + "/v1/models", KEY)[0] == 200
        status, body = _get(url + "/server_info", KEY)
        assert status == 200 and KEY.encode() not in body and ADMIN.encode() not in body
        assert _get(url + "/flush_cache", KEY)[0] == 401
        assert _get(url + "/flush_cache", ADMIN)[0] == 200
