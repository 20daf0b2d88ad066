"""A Hugging Face checkpoint's tokenizer behind the interface of `minirl.modeling.tokenizer.CharTokenizer`.

`HFTokenizer` wraps a `tokenizers.Tokenizer` (the Rust library behind transformers) and encodes
exactly as transformers' fast tokenizer on the same files: `encode(text, bos=True)` runs the
file's post-processor (which adds BOS for Llama, nothing for Qwen), `bos=False` does not.
`HFTokenizer.from_dir(DIR)` reads a checkpoint directory: the special tokens and chat template
from `tokenizer_config.json` (or `chat_template.jinja`), and every EOS id the model may end with
(`extra_eos_ids`, from generation_config.json via minirl.hf.model_files). `save(DIR)` writes files
transformers' `AutoTokenizer` loads back. The chat template is rendered as transformers renders
it (minirl/hf/chat_template.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from minirl.modeling.tokenizer import write_files


class HFTokenizer:
    """A Hugging Face tokenizer (`tokenizers.Tokenizer`) with the interface of `CharTokenizer`.

    Build it with `HFTokenizer.from_dir(path)`; the constructor takes a loaded tokenizer and the
    special tokens' strings, and does no I/O. Without a `pad_token`, padding uses the EOS id
    (as for Llama 3, which defines no padding token), but no padding token is invented: the
    template sees none, and `save` writes none. `config` is the tokenizer_config.json it came
    from, written back unchanged by `save`."""

    def __init__(
        self,
        tokenizer,
        eos_token: str,
        bos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        extra_eos_ids: tuple[int, ...] = (),
        config: dict | None = None,
    ):
        self._tok = tokenizer
        self.eos_id = self._id(eos_token, "eos_token")
        self.bos_id = None if bos_token is None else self._id(bos_token, "bos_token")
        self.pad_id = self.eos_id if pad_token is None else self._id(pad_token, "pad_token")
        outside = [i for i in extra_eos_ids if not 0 <= i < self.vocab_size]
        if outside:
            raise ValueError(f"eos ids {outside} are outside the tokenizer's vocabulary")
        self.eos_ids = tuple(dict.fromkeys((self.eos_id, *extra_eos_ids)))
        if chat_template is not None:  # a template that is not valid Jinja: said here, once
            from minirl.hf.chat_template import compile_template

            compile_template(chat_template)
        self.chat_template = chat_template
        self.special_tokens = {
            "eos_token": eos_token,
            "bos_token": bos_token,
            "pad_token": pad_token,
        }
        self.config = dict(config or {"tokenizer_class": "PreTrainedTokenizerFast"})

    def _id(self, token: str, role: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"{role} {token!r} is not in the tokenizer's vocabulary")
        return i

    @classmethod
    def from_dir(cls, path, extra_eos_ids: tuple[int, ...] = ()) -> HFTokenizer:
        """Load a checkpoint directory's tokenizer.json, tokenizer_config.json (special tokens,
        chat template) and chat_template.jinja. `extra_eos_ids`: more ids that end a completion
        (generation_config.json's, read by minirl.hf.model_files.read_token_ids)."""
        from tokenizers import Tokenizer  # the optional "hf" extra

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"no tokenizer file at {file}")
        from minirl.configlib import read_json_object

        config = read_json_object(file.parent / "tokenizer_config.json", ValueError) or {}
        special = _special_tokens(config)
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust library raises its own exception types
            raise ValueError(f"{file} is not a tokenizers file: {e}") from None
        eos = special.get("eos_token")
        if eos is None and extra_eos_ids:  # no eos_token in the config: the model's first EOS id
            eos = tok.id_to_token(extra_eos_ids[0])
        if eos is None:
            raise ValueError(
                f"no EOS token for {file}: neither tokenizer_config.json nor "
                "generation_config.json names one"
            )
        try:
            return cls(
                tok,
                eos,
                special.get("bos_token"),
                special.get("pad_token"),
                _chat_template(config, file.parent),
                tuple(extra_eos_ids),
                config,
            )
        except ValueError as e:
            raise ValueError(f"{file.parent}: {e}") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocabulary(self) -> dict[str, int]:
        """Every token's string and id, added (special) tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The longest token string in the vocabulary. Byte-level vocabularies spell each byte
        as one character, so this bounds the characters a token decodes to from above."""
        return max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)

    def apply_chat_template(
        self, messages, add_generation_prompt: bool = True, tools=None, **kwargs
    ) -> str:
        """The prompt text of `messages` (a list of {"role", "content"} dicts), laid out by the
        checkpoint's chat template as transformers lays it out (minirl/hf/chat_template.py).
        `tools`: OpenAI function schemas the template shows the model (None = none). `kwargs`:
        more variables the template reads, as transformers passes them (e.g. Qwen3's
        `enable_thinking=False`)."""
        from minirl.hf.chat_template import render

        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template; set data.chat_template=false")
        tokens = {k: v for k, v in self.special_tokens.items() if v is not None}
        unk = self.config.get("unk_token")
        tokens["unk_token"] = unk.get("content") if isinstance(unk, dict) else unk
        return render(
            self.chat_template, messages, add_generation_prompt, tools=tools, **tokens, **kwargs
        )

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> np.ndarray:
        ids = self._tok.encode(text, add_special_tokens=bos).ids
        return np.asarray(ids + ([self.eos_id] if eos else []), np.int32)

    def decode(self, ids, skip_special: bool = True) -> str:
        # tokenizers drops unknown ids silently (and overflows on negative ones); like
        # CharTokenizer, show each as U+FFFD and decode the valid runs between them.
        # skip_special also drops the pad/bos/eos ids, even if the file does not mark them special.
        roles = {self.pad_id, self.bos_id, *self.eos_ids} if skip_special else set()
        pieces, run = [], []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i in roles:
                continue
            if 0 <= i < self.vocab_size:
                run.append(i)
                continue
            pieces.append(self._tok.decode(run, skip_special_tokens=skip_special) + "\ufffd")
            run = []
        pieces.append(self._tok.decode(run, skip_special_tokens=skip_special))
        return "".join(pieces)

    def save(self, directory) -> None:
        """tokenizer.json and tokenizer_config.json (with the chat template) in `directory`: the
        source's tokenizer_config.json as it was (special tokens in their own form, none added);
        only what it lacks (a template read from chat_template.jinja, a token given to the
        constructor) is added."""
        config = dict(self.config)
        for role, token in self.special_tokens.items():
            if token is not None and config.get(role) is None:
                config[role] = token
        if self.chat_template is not None and config.get("chat_template") is None:
            config["chat_template"] = self.chat_template
        write_files(directory, self._tok, config)


def _special_tokens(config: dict) -> dict[str, str]:
    """bos/eos/pad token strings from a transformers tokenizer_config.json dict."""
    out = {}
    for role in ("bos_token", "eos_token", "pad_token"):
        value = config.get(role)
        if isinstance(value, dict):  # older files: {"content": "<|endoftext|>", ...}
            value = value.get("content")
        if value:
            out[role] = value
    return out


def _chat_template(config: dict, directory: Path) -> str | None:
    """The checkpoint's default chat template: tokenizer_config.json's `chat_template` (a string,
    or a list of {"name", "template"} of which "default" is used), else chat_template.jinja."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None and (directory / "chat_template.jinja").exists():
        template = (directory / "chat_template.jinja").read_text()
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{directory}/tokenizer_config.json: chat_template is not a string")
    return template
