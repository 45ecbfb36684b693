"""The simulator's endpoints, bodies and error shapes as SGLang 0.5.23 serves them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.http import http
from tests.support.sim import launched_sim

PARSERS = ("--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3")


def test_info_model_list_generate_flush_loads_and_metrics(tmp_path: Path) -> None:
    """Every read endpoint answers with SGLang's shape; /metrics exists with --enable-metrics and moves."""
    args = ("--tp-size", "2", "--enable-metrics", "--served-model-name", "sim-model", *PARSERS)
    with launched_sim(tmp_path, *args) as sim:
        assert sim.get("/ping").status == 200
        info = sim.get("/model_info").json()
        assert info["model_path"] == "Qwen/Qwen3-8B" and info["is_generation"] is True
        assert info["architectures"] == ["Qwen3ForCausalLM"]
        assert sim.get("/get_model_info").json() == info
        sim.wait_log("Endpoint '/get_model_info' is deprecated")
        for path in ("/server_info", "/get_server_info"):
            server = sim.get(path).json()
            assert (server["tool_call_parser"], server["reasoning_parser"]) == ("qwen25", "qwen3")
            assert server["tp_size"] == 2 and server["version"] == "0.5.23"
            assert server["scheduler_info"]["status"] == "ready"
        models = sim.get("/v1/models").json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["sim-model"]
        assert models["data"][0]["owned_by"] == "sglang"
        assert sim.get("/v1/models/sim-model").json()["id"] == "sim-model"
        missing = sim.get("/v1/models/nope")
        assert missing.status == 404 and missing.json()["code"] == "model_not_found"
        before = sim.metrics()
        gen = sim.post(
            "/generate", {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 4}}
        )
        assert gen.status == 200
        out = gen.json()
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= 4
        assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        stream = sim.post(
            "/generate", {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 3}}
        )
        events = [e for e in stream.body.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["text"]
        flushed = http(sim.base_url + "/flush_cache", "POST")
        assert flushed.status == 200 and flushed.body.startswith(b"Cache flushed.\n")
        loads = sim.get("/v1/loads").json()
        assert len(loads["loads"]) == 1 and loads["loads"][0]["dp_rank"] == 0
        assert {"num_running_reqs", "num_waiting_reqs", "token_usage", "timestamp"} <= set(loads["loads"][0])
        after = sim.metrics()
        key = 'sglang:num_requests_total{model_name="sim-model",engine_type="unified"}'
        assert after[key] == before.get(key, 0) + 2
        decode = next(
            k for k in after if k.startswith("sglang:realtime_tokens_total") and 'mode="decode"' in k
        )
        assert after[decode] > before[decode]
        assert any(k.startswith("sglang:num_running_reqs{") for k in after)
        assert any('sglang:http_requests_total{endpoint="/generate"' in k for k in after)


def test_no_metrics_flag_and_bad_input_get_sglang_codes(tmp_path: Path) -> None:
    """No --enable-metrics: /metrics 404; malformed JSON, wrong type, oversize: 400/413; any model name is served."""
    with launched_sim(tmp_path, *PARSERS) as sim:
        missing = sim.get("/metrics")
        assert (missing.status, missing.json()) == (404, {"detail": "Not Found"})
        chat = sim.base_url + "/v1/chat/completions"
        malformed = http(chat, "POST", b"{not json")
        assert malformed.status == 400
        assert set(malformed.json()) == {"object", "message", "type", "param", "code"}
        assert malformed.json()["code"] == 400
        wrong_type = http(chat, "POST", b"model=x", content_type="application/x-www-form-urlencoded")
        assert wrong_type.status == 400 and wrong_type.json()["object"] == "error"
        msg = [{"role": "user", "content": "hi"}]
        unknown = http(chat, "POST", {"model": "nope", "messages": msg})
        assert unknown.status == 200, "SGLang 0.5.23 ignores the request's model name"
        long_prompt = [{"role": "user", "content": "word " * 140_000}]
        too_long = http(chat, "POST", {"model": "Qwen/Qwen3-8B", "messages": long_prompt})
        assert too_long.status == 400
        assert "longer than the model's context length (131072 tokens)" in too_long.json()["message"]
        no_text = http(sim.base_url + "/generate", "POST", {"sampling_params": {}})
        assert (no_text.status, no_text.json()) == (
            400,
            {"error": {"message": "Either text or input_ids should be provided."}},
        )
        oversize = http(chat, "POST", b'{"pad": "' + b"x" * (33 * 2**20) + b'"}', timeout=60)
        assert oversize.status == 413
        assert sim.get("/health").status == 200
