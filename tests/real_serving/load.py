"""Client load on the real server from SGLang's own benchmark client (`python -m sglang.benchmark.serving`).

The random-ids dataset (token ids drawn from the tokenizer's vocabulary: nothing downloaded), `--max-concurrency`
streams at most in flight, fixed prompt and output lengths (`ignore_eos` is the client's default), a bounded
request count and, optionally, a request rate. The client has no retry: a request the server drops or refuses
is an error in its report, and `failed` counts them.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ServingLoad:
    """One run of SGLang's benchmark client against `base_url`, in a subprocess of the serving venv."""

    python: Path
    base_url: str
    model_dir: Path
    out: Path
    requests: int = 32
    concurrency: int = 8
    input_len: int = 64
    output_len: int = 32
    rate: float | None = None  # requests per second (Poisson); None sends as fast as concurrency allows
    proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            str(self.python), "-m", "sglang.benchmark.serving", "--backend", "sglang",
            "--base-url", self.base_url, "--model", str(self.model_dir), "--tokenizer", str(self.model_dir),
            "--dataset-name", "random-ids", "--num-prompts", str(self.requests),
            "--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
            "--random-range-ratio", "1.0", "--max-concurrency", str(self.concurrency),
            "--request-rate", "inf" if self.rate is None else str(self.rate),
            "--warmup-requests", "0", "--ready-check-timeout-sec", "0", "--seed", "1",
            "--disable-tqdm", "--output-details", "--output-file", str(self.out),
        ]  # fmt: skip

    def start(self) -> ServingLoad:
        log = open(self.out.with_suffix(".log"), "wb")  # noqa: SIM115 - the child writes it until it exits
        with log:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=self.out.parent
            )
        return self

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the client; its result: requests sent, completed, failed, the distinct errors, duration."""
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            raise AssertionError(f"the benchmark client ran over {timeout_s:.0f} s") from None
        if rc != 0 or not self.out.is_file():
            tail = self.out.with_suffix(".log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"the benchmark client exited {rc}:\n{tail}")
        result = json.loads(self.out.read_text().splitlines()[-1])
        errors = [e for e in result.get("errors", []) if e]
        return {
            "requests": self.requests,
            "completed": int(result["completed"]),
            "failed": self.requests - int(result["completed"]),
            "errors": sorted({e.strip().splitlines()[-1][:160] for e in errors})[:5],
            "duration_s": round(float(result["duration"]), 1),
            "output_throughput": round(float(result["output_throughput"]), 1),
            "max_concurrent_requests": result.get("max_concurrent_requests"),
        }

    def stop(self) -> None:
        """Kill the client if it still runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
