"""Build the tiny Qwen2 models the real-serving tier launches (run with the serving venv's interpreter).

`python build_models.py OUT` writes three model directories under OUT, nothing downloaded:
- `random-qwen2.5/`: a 2-layer Qwen2 (hidden 64) config and tokenizer only, for `--load-format dummy`
  (random weights: never calls a tool, never stops before `max_tokens`);
- `scripted-qwen2.5/`: a 1-layer Qwen2 whose layer weights are all zero, so the next token depends only on the
  current one; embeddings and `lm_head` chain `<tool_call>` -> the call's JSON -> `</tool_call>` -> `<|im_end|>`,
  so greedy decoding answers every prompt with `get_weather({"city": "Paris"})` in Qwen/Hermes markup;
- `scripted-qwen3/`: the same with reasoning: after a plain prompt it thinks (`<think>…</think>42`), after the
  template's thinking-off suffix (`</think>` + a double newline) it calls the tool.
The directory names carry the family (`qwen2.5`, `qwen3`) that tells the daemon which parsers to expect.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HIDDEN = 64
VOCAB = 640
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
THOUGHT = "17 plus 25 is 42."
ANSWER = "42"
DOUBLE_NEWLINE = "\n\n"
SCALE = 10.0
CORPUS = [
    "You are a tool-using assistant. What is the weather in Paris right now? Reply with only the number.",
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}',
    "system user assistant tool Tools tools function call arguments name content role",
] * 8

TEMPLATE = (  # newlines only as {{ '\n' }}: HF renders with trim_blocks, which eats a newline after a tag
    r"{% if tools %}<|im_start|>system{{ '\n' }}"
    r"{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    r"{{ '\n\n# Tools\n\n<tools>' }}{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}"
    r"{{ '\n</tools>\n\nReply with <tool_call>\n{\"name\": <function-name>, \"arguments\": <args>}\n</tool_call>' }}"
    r"<|im_end|>{{ '\n' }}{% endif %}"
    r"{% for message in messages %}{% if not (tools and loop.first and message.role == 'system') %}"
    r"<|im_start|>{{ message.role }}{{ '\n' }}{{ message.content or '' }}<|im_end|>{{ '\n' }}"
    r"{% endif %}{% endfor %}"
    r"{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}"
)
THINKING_OFF = (  # the reasoning model's generation prompt when thinking is off, as Qwen3's template has it
    r"{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
    r"<think>{{ '\n\n' }}</think>{{ '\n\n' }}{% endif %}"
)


def tokenizer(reasoning: bool) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few lines, with the chat markup and the scripted answers as added tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 32,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    pieces = [*MARKUP, CALL, *([THOUGHT, ANSWER, DOUBLE_NEWLINE] if reasoning else [])]
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in pieces])
    template = TEMPLATE + (THINKING_OFF if reasoning else "")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=template,
    )


def chain(tok: PreTrainedTokenizerFast, reasoning: bool) -> tuple[dict[int, int], int]:
    """(each chain token -> its successor, the successor of every other token)."""
    ids = {p: tok.convert_tokens_to_ids(p) for p in [*SPECIAL, *MARKUP]}
    ids |= {p: tok.convert_tokens_to_ids(p) for p in tok.get_added_vocab() if p not in ids}
    tool = [ids["<tool_call>"], ids[CALL], ids["</tool_call>"], ids["<|im_end|>"]]
    links = dict(itertools.pairwise(tool))
    if not reasoning:
        return links, tool[0]
    links[ids[DOUBLE_NEWLINE]] = tool[0]
    think = [ids["<think>"], ids[THOUGHT], ids["</think>"], ids[ANSWER], ids["<|im_end|>"]]
    links |= dict(itertools.pairwise(think))
    return links, think[0]


def scripted_weights(links: dict[int, int], default_next: int, vocab: int) -> dict[str, torch.Tensor]:
    """Zero layer weights; each chain token on its own unit vector, `lm_head` pointing it at its successor."""
    chain_tokens = sorted(links)
    shared = len(chain_tokens)
    embed = torch.zeros(vocab, HIDDEN)
    embed[:, shared] = 1.0
    head = torch.zeros(vocab, HIDDEN)
    for axis, token in enumerate(chain_tokens):
        embed[token] = 0.0
        embed[token, axis] = 1.0
        head[links[token], axis] = SCALE
    head[default_next, shared] = SCALE
    inter = 2 * HIDDEN
    kv = HIDDEN // 2
    layer = {
        "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "self_attn.q_proj.bias": (HIDDEN,),
        "self_attn.k_proj.weight": (kv, HIDDEN),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.weight": (kv, HIDDEN),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "mlp.gate_proj.weight": (inter, HIDDEN),
        "mlp.up_proj.weight": (inter, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, inter),
        "input_layernorm.weight": (HIDDEN,),
        "post_attention_layernorm.weight": (HIDDEN,),
    }
    tensors = {f"model.layers.0.{k}": torch.zeros(shape) for k, shape in layer.items()}
    tensors |= {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": head,
        "model.norm.weight": torch.ones(HIDDEN),
    }
    return tensors


def config(layers: int, eos: int, pad: int) -> dict[str, object]:
    """A Qwen2 config: hidden 64, 4 heads, 2 KV heads, float32."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "use_sliding_window": False,
    }


def build(out: Path, name: str, scripted: bool, reasoning: bool) -> None:
    """Write one model directory (atomically: a temporary name renamed at the end)."""
    final = out / name
    if (final / "config.json").is_file():
        return
    work = out / f".{name}.tmp"
    work.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(reasoning)
    tok.save_pretrained(work)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    (work / "config.json").write_text(json.dumps(config(1 if scripted else 2, eos, pad), indent=1))
    (work / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": pad}))
    if scripted:
        links, default_next = chain(tok, reasoning)
        save_file(scripted_weights(links, default_next, VOCAB), str(work / "model.safetensors"))
    work.rename(final)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    build(out, "random-qwen2.5", scripted=False, reasoning=False)
    build(out, "scripted-qwen2.5", scripted=True, reasoning=False)
    build(out, "scripted-qwen3", scripted=True, reasoning=True)


if __name__ == "__main__":
    main()
