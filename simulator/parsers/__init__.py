"""Server-side tool-call and reasoning parsing of the simulator, shaped like SGLang's detectors.

Own code, written to reproduce what SGLang 0.5.23 returns for each parser, including when the
parser does not match the model's markup: missing or foreign markers pass through as content,
same-family mismatches give the shapes the real 0.5.23 parsers produce (e.g. deepseekv3 on V3.1 output:
no calls, finish_reason stop, raw content; streaming swallows it). Newer SGLang `main` answers
`tool_calls: []` with finish_reason `tool_calls` there (parsers.md §4); the real-tier tests pin 0.5.23.

One module per family (or group of small families) holds its detector — the whole-output grammar and the
streaming grammar together — and its reasoning formats; `registry` maps the `--tool-call-parser` and
`--reasoning-parser` names to them; `chat` is the serving layer that applies them to a chat completion.
"""
