"""Tiny Hugging Face checkpoint directories for tests, made here (nothing is downloaded).

    make_tokenizer_dir(path, style="qwen" | "llama")   tokenizer.json + tokenizer_config.json
                                                        ("qwen_tools", "llama_tools": the family's
                                                        tool-calling template besides)
    make_model_dir(path, arch="qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe", style=...)
                                                        + config.json, model.safetensors and
                                                        generation_config.json (two EOS ids)
    make_model_dir(path, arch="qwen2_rm")               a reward model: Qwen2ForSequenceClassification
                                                        with one label (dims={"num_labels": 2}: two)
    make_model_dir(path, vocab_tokens=151_643, max_positions=...)
                                                        Qwen's real vocabulary size (151,936 ids
                                                        in the model), still a tiny network

The tokenizer is a byte-level BPE trained with `tokenizers` on generated word-problem text, with
the special tokens and a chat template in the style of the family: "qwen" is ChatML
(`<|im_start|>role\\n...<|im_end|>`, a default system message, no BOS, eos `<|im_end|>`, pad
`<|endoftext|>`); "llama" has Llama 3's header tokens, a template that starts with
`{{ bos_token }}` and a post-processor that adds BOS to plain text. The model is a random
transformers Qwen2 (GQA, q/k/v biases, tied embeddings), Qwen3 (q/k norm, head_dim 32, tied) or
their mixture-of-experts forms (4 experts, 2 per token; Qwen2-MoE with a shared expert) whose vocabulary is the tokenizer's rounded up to a multiple of 64 (as Qwen pads it). Both are
deterministic (fixed seeds) and take about a second. `vocab_tokens` pads the trained tokenizer with
tokens no merge produces (so encoding is unchanged) up to a real model's vocabulary size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] != 'system' or not loop.first %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
# Tool calling in each family's format (tests/envs/test_tool_calls.py): Qwen2.5's (tools as JSON
# lines in a <tools> block of the system message; calls as <tool_call> blocks; tool results as
# <tool_response> blocks of a user turn) and Llama 3.1's (tools as indented JSON in the first user
# message; a call as the whole assistant turn {"name", "parameters"}; results in the ipython role).
QWEN_TOOLS_TEMPLATE = (
    "{%- set system = messages[0]['content'] if messages[0]['role'] == 'system' "
    "else 'You are a helpful assistant.' %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call>\' }}'
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{%- set call = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' '
    "+ (call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_TOOLS_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system + '<|eot_id|>' }}"
    "{%- if tools %}"
    "{%- set first = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\\n\\n' }}"
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of '
    "argument name and its value}.Do not use variables.\\n\\n' }}"
    "{%- for tool in tools %}{{- (tool | tojson(indent=4)) + '\\n\\n' }}{%- endfor %}"
    "{{- first + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role in ('tool', 'ipython') %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"
    "{%- if message.content is mapping or message.content is iterable %}"
    "{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- elif message.tool_calls %}"
    "{%- if message.tool_calls | length != 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    '{{- \'{"name": "\' + call.name + \'", "parameters": \' + (call.arguments | tojson) '
    "+ '}<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' "
    "+ message.content | trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)  # the MoE archs'
STYLES = {
    # specials (in id order), config's special tokens, extra EOS of generation_config, template
    "qwen": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
        "<|endoftext|>",
        QWEN_TEMPLATE,
    ),
    "llama": (
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>", "pad_token": None},
        "<|end_of_text|>",
        LLAMA_TEMPLATE,
    ),
}
STYLES["qwen_tools"] = (*STYLES["qwen"][:3], QWEN_TOOLS_TEMPLATE)
STYLES["llama_tools"] = (*STYLES["llama"][:3], LLAMA_TOOLS_TEMPLATE)


def corpus(n: int = 400) -> list[str]:
    """Word-problem-like lines: digits, words, \\boxed{}, punctuation."""
    rng = np.random.default_rng(0)
    names, things = ["Tom", "Ana", "Li", "Sam"], ["apples", "books", "coins", "pens"]
    out = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(1, 50, 2))
        name, thing = names[rng.integers(4)], things[rng.integers(4)]
        out.append(
            f"{name} has {a} {thing} and buys {b} more. How many {thing} now? "
            f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."
        )
    return out


def make_tokenizer_dir(
    path,
    style: str = "qwen",
    vocab_size: int = 320,
    vocab_tokens: int = 0,
    extra_text: tuple[str, ...] = (),
) -> Path:
    """Train a byte-level BPE and write tokenizer.json + tokenizer_config.json into `path`; with
    `vocab_tokens`, its vocabulary padded to that many tokens that nothing encodes to
    (`extra_text`: lines trained on besides the word problems)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials, config, _, template = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus() + list(extra_text), trainer)
    if style.startswith("llama"):
        bos = config["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    if vocab_tokens:
        _pad_vocabulary(path / "tokenizer.json", vocab_tokens)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "model_max_length": 256,
        **config,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return path


def _pad_vocabulary(file: Path, size: int) -> None:
    """Add unreachable tokens (no merge makes them) to a BPE tokenizer.json until it has `size`."""
    data = json.loads(file.read_text())
    vocab = data["model"]["vocab"]
    vocab.update({f"<pad_{i}>": i for i in range(len(vocab), size)})
    file.write_text(json.dumps(data))


def make_model_dir(
    path,
    arch: str = "qwen2",
    style: str = "qwen",
    seed: int = 0,
    vocab_tokens: int = 0,
    max_positions: int = 256,
    dims: dict | None = None,
    vocab_size: int = 320,
    extra_text: tuple[str, ...] = (),
) -> Path:
    """A random tiny transformers model of `arch` saved beside a `style` tokenizer in `path`
    (`vocab_tokens`: a tokenizer padded to that size; `max_positions`: the model's positions).
    `dims` replaces the config's sizes (hidden_size, num_hidden_layers, ...); `vocab_size` and
    `extra_text` go to the tokenizer's training."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    path = make_tokenizer_dir(path, style, vocab_size, vocab_tokens, extra_text)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    _, config, extra_eos, _ = STYLES[style]
    eos = [tok.token_to_id(config["eos_token"]), tok.token_to_id(extra_eos)]
    pad = tok.token_to_id(config["pad_token"] or extra_eos)
    bos = tok.token_to_id(config["bos_token"]) if config["bos_token"] else None
    vocab = -(-tok.get_vocab_size() // 64) * 64
    sizes = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=bos,
        eos_token_id=eos[0],
        pad_token_id=pad,
    ) | (dims or {})
    if arch == "qwen2":
        model_cfg = transformers.Qwen2Config(**sizes)
        model_cls = transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        model_cfg = transformers.Qwen3Config(**sizes, head_dim=32)
        model_cls = transformers.Qwen3ForCausalLM
    elif arch == "qwen3_moe":  # 4 experts, 2 per token, renormalised; every layer sparse
        model_cfg = transformers.Qwen3MoeConfig(**sizes, head_dim=32, **MOE, norm_topk_prob=True)
        model_cls = transformers.Qwen3MoeForCausalLM
    elif arch == "qwen2_moe":  # + the shared expert, unnormalised gates
        model_cfg = transformers.Qwen2MoeConfig(**sizes, **MOE, shared_expert_intermediate_size=64)
        model_cls = transformers.Qwen2MoeForCausalLM
    elif arch == "qwen2_rm":  # Qwen2 with transformers' `score` head (no LM head)
        model_cfg = transformers.Qwen2Config(**{"num_labels": 1, **sizes})
        model_cls = transformers.Qwen2ForSequenceClassification
    else:
        raise ValueError(f"unknown arch {arch!r}")
    torch.manual_seed(seed)
    model = model_cls(model_cfg).eval()
    with torch.no_grad():  # weights large enough for logits of a few units, non-trivial norms
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.05 if p.ndim == 1 else 1.0 / p.shape[-1] ** 0.5))
    model.save_pretrained(path)
    generation = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": True}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path
