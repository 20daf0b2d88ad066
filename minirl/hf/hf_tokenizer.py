"""A Hugging Face checkpoint's tokenizer behind the interface of `minirl.modeling.tokenizer.CharTokenizer`.

`HFTokenizer` wraps a `tokenizers.Tokenizer` (the Rust library behind transformers) and encodes
exactly as transformers' fast tokenizer on the same files: `encode(text, bos=True)` runs the
file's post-processor (which adds BOS for Llama, nothing for Qwen), `bos=False` does not.
`encode(text, parse_special=False)` reads the special tokens' strings in `text` as text (what
transformers' `split_special_tokens=True` does), and `encode_chat(messages)` encodes a chat
template's rendering so that only the template's own markup becomes special tokens: what a
message says can never end a turn or the text (a reward model's input, minirl/hf/reward_model.py).
`HFTokenizer.from_dir(DIR)` reads a checkpoint directory: the special tokens and chat template
from `tokenizer_config.json` (or `chat_template.jinja`), and every EOS id the model may end with
(`extra_eos_ids`, from generation_config.json via minirl.hf.model_files). `save(DIR)` writes files
transformers' `AutoTokenizer` loads back. The chat template is rendered as transformers renders
it (minirl/hf/chat_template.py).
"""

from __future__ import annotations

import functools
import re
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

    def encode(
        self, text: str, bos: bool = True, eos: bool = False, parse_special: bool = True
    ) -> np.ndarray:
        """`text`'s ids [T]; `parse_special=False`: a special token's string in it ("<|im_end|>")
        is encoded as the text it spells, never as the token."""
        tok = self._tok if parse_special else self._as_text
        ids = tok.encode(text, add_special_tokens=bos).ids
        return np.asarray(ids + ([self.eos_id] if eos else []), np.int32)

    @functools.cached_property
    def special_ids(self) -> dict[str, int]:
        """The special (control) tokens, string -> id: the added tokens the file marks special."""
        added = self._tok.get_added_tokens_decoder()
        return {t.content: i for i, t in added.items() if t.special}

    @functools.cached_property
    def _as_text(self):
        """A copy of the tokenizer that encodes special tokens' strings as text."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = True
        return tok

    def encode_chat(self, messages, add_generation_prompt: bool = True, **kwargs) -> np.ndarray:
        """The ids [T] of `messages` laid out by the chat template, no special tokens added (the
        template writes its own), where only the template's markup becomes special tokens: a
        special token's string inside a message's content is encoded as text. Messages without
        one: exactly `encode(apply_chat_template(messages, ...), bos=False)`, as transformers.
        Else the contents' strings are hidden behind characters no message holds while the
        template renders; the text between the template's special tokens is then encoded with
        the strings put back, as text."""
        hidden, shown = _hide(messages, self.special_ids, self.chat_template or "")
        text = self.apply_chat_template(hidden, add_generation_prompt, **kwargs)
        if not shown:
            return self.encode(text, bos=False)
        restore, ids, start = str.maketrans(shown), [], 0
        special = set(self.special_ids.values())
        encoding = self._tok.encode(text, add_special_tokens=False)
        for i, (a, b) in zip(encoding.ids, encoding.offsets, strict=True):
            if i in special and self._tok.id_to_token(i) in text[a:b]:
                ids += self._as_text.encode(
                    text[start:a].translate(restore), add_special_tokens=False
                ).ids
                ids.append(i)
                start = b
        ids += self._as_text.encode(text[start:].translate(restore), add_special_tokens=False).ids
        return np.asarray(ids, np.int32)

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


def _hide(messages, strings, template: str) -> tuple[list, dict[str, str]]:
    """(`messages` with each of `strings` in a content replaced by a private-use character that
    no content and not the template holds, {that character: the string it hides})."""
    texts = [
        m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)
    ]
    found = sorted({s for s in strings if any(s in t for t in texts)}, key=len, reverse=True)
    if not found:
        return messages, {}
    used = set(template).union(*texts)
    marks = (chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in used)  # Unicode plane 15
    hide = dict(zip(found, marks, strict=False))
    pattern = re.compile("|".join(map(re.escape, found)))  # longest first: leftmost-longest
    swap = lambda m: {**m, "content": pattern.sub(lambda x: hide[x.group()], m["content"])}
    out = [
        swap(m) if isinstance(m, dict) and isinstance(m.get("content"), str) else m
        for m in messages
    ]
    return out, {mark: string for string, mark in hide.items()}


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
