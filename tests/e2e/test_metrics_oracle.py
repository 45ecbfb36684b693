"""The fast `/metrics` parser of the probes reads the simulator's exposition exactly as prometheus_client does."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from probes.progress import parse_metrics
from tests.support.sim import Sim, launched_sim

KIMI = (
    "--model-path",
    "moonshotai/Kimi-K2.5",
    "--tool-call-parser",
    "kimi_k2",
    "--reasoning-parser",
    "kimi_k2",
)
Row = tuple[str, tuple[tuple[str, str], ...], float]


def oracle(text: str) -> list[Row]:
    """Every sample as prometheus_client's reference parser reads it, in order."""
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def fast(text: str) -> list[Row]:
    """Every sample as probes.progress.parse_metrics reads it, in order."""
    return [(s.name, tuple(sorted(s.labels.items())), s.value) for s in parse_metrics(text)]


def agree(sim: Sim) -> list[Row]:
    """Scrape once; both parsers must see the same samples, names, labels and values."""
    reply = sim.get("/metrics")
    assert reply.status == 200
    text = reply.body.decode()
    expected = oracle(text)
    assert fast(text) == expected
    return expected


def chat(sim: Sim, stream: bool) -> None:
    """One chat completion (streamed or not) that must succeed."""
    body = {
        "model": "moonshotai/Kimi-K2.5",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 24,
        "stream": stream,
    }
    assert sim.post("/v1/chat/completions", body).status == 200


def test_parsers_agree_on_a_tp2_server_idle_then_after_traffic(tmp_path: Path) -> None:
    """tp-2 with metrics on: idle (empty histograms) and after plain and streamed chats (counters, buckets, HTTP)."""
    with launched_sim(tmp_path, *KIMI, "--tp-size", "2", "--enable-metrics") as sim:
        idle = agree(sim)
        chat(sim, stream=False)
        chat(sim, stream=True)
        busy = agree(sim)
    assert {name for name, _, _ in idle} <= {name for name, _, _ in busy}
    ranked = [dict(labels) for name, labels, _ in busy if name == "sglang:realtime_tokens_total"]
    assert ranked and all("tp_rank" in labels for labels in ranked), (
        "scheduler counters carry their rank label"
    )
    buckets = [value for name, labels, value in busy if name.endswith("_bucket") and ("le", "+Inf") in labels]
    assert buckets and max(buckets) >= 1, "a histogram saw the traffic"


def test_parsers_agree_on_a_pd_prefill_server(tmp_path: Path) -> None:
    """A PD prefill's stats write every PD queue gauge, the decode's too (as the real prefill's do; a real decode
    writes none until a decode batch's stats); both parsers read them the same."""
    args = ("--disaggregation-mode", "prefill", "--enable-metrics", "--model-path", "Qwen/Qwen3-8B")
    with launched_sim(tmp_path, *args) as sim:
        samples = agree(sim)
    assert any(dict(labels).get("engine_type") == "prefill" for _, labels, _ in samples)
    names = {name for name, _, _ in samples}
    assert {"sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_decode_transfer_queue_reqs"} <= names
