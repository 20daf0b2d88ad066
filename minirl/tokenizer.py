"""Tokenizers with one small interface: a character tokenizer for the built-in tasks, and an
adapter for Hugging Face `tokenizer.json` files.

`CharTokenizer` maps each character of a fixed alphabet to one id, after three special ids
(PAD=0, BOS=1, EOS=2). It is deliberately tiny: the built-in tasks use digits, a few operators
and letters, so the model's vocabulary (and its softmax) stays small and fast on a laptop CPU.
Characters outside the alphabet raise a clear error when encoding (the tasks generate only
known characters; model output is decoded, never encoded).

`HFTokenizer` wraps a `tokenizers.Tokenizer` (the Rust library behind transformers) behind the
same interface: vocab_size, pad_id, bos_id, eos_id, encode, decode. Simplified on purpose: BOS
and EOS are added by `encode` itself (the file's post-processor is not used, so `bos=False`
really means no BOS); the special tokens come from the arguments or `tokenizer_config.json`;
no chat templates (format prompts in the task).

Interface (both classes):
    vocab_size: int; pad_id: int; eos_id: int; bos_id: int (None for models without a BOS
    token, e.g. Qwen: then `encode(bos=True)` adds nothing)
    encode(text, bos=True, eos=False) -> np.ndarray int32 [T]
    decode(ids, skip_special=True) -> str   (unknown ids decode to U+FFFD, never raise)
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")

# Digits, lower-case letters, punctuation used by the tasks, space and newline. Stable order:
# changing it changes every token id, so only ever append.
DEFAULT_ALPHABET = string.digits + string.ascii_lowercase + " +-*/=()<>,.:;?#_[]{}%'\n" + "^!|&"


class CharTokenizer:
    """One id per character. Same interface as the Hugging Face adapter in this module."""

    def __init__(self, alphabet: str = DEFAULT_ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet has repeated characters")
        self.alphabet = alphabet
        self._id = {ch: i + len(_SPECIALS) for i, ch in enumerate(alphabet)}
        self.pad_id, self.bos_id, self.eos_id = PAD, BOS, EOS

    @property
    def vocab_size(self) -> int:
        return len(_SPECIALS) + len(self.alphabet)

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> np.ndarray:
        try:
            ids = [self._id[ch] for ch in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the tokenizer's alphabet") from None
        return np.asarray(([BOS] if bos else []) + ids + ([EOS] if eos else []), np.int32)

    def decode(self, ids, skip_special: bool = True) -> str:
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i < len(_SPECIALS):
                if not skip_special:
                    out.append(_SPECIALS[i])
                continue
            j = i - len(_SPECIALS)
            out.append(self.alphabet[j] if j < len(self.alphabet) else "\ufffd")
        return "".join(out)


class HFTokenizer:
    """A Hugging Face tokenizer (`tokenizers.Tokenizer`) with the interface of `CharTokenizer`.

    Build it with `HFTokenizer.from_file(path)`; the constructor takes a loaded tokenizer and the
    special tokens' strings, and does no I/O. `pad_token` defaults to `eos_token` (as for Qwen
    and Llama, which define no separate padding token)."""

    def __init__(self, tokenizer, eos_token: str, bos_token: str | None = None,
                 pad_token: str | None = None):
        self._tok = tokenizer
        self.eos_id = self._id(eos_token, "eos_token")
        self.bos_id = None if bos_token is None else self._id(bos_token, "bos_token")
        self.pad_id = self.eos_id if pad_token is None else self._id(pad_token, "pad_token")

    def _id(self, token: str, role: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"{role} {token!r} is not in the tokenizer's vocabulary")
        return i

    @classmethod
    def from_file(cls, path, eos_token: str | None = None, bos_token: str | None = None,
                  pad_token: str | None = None) -> HFTokenizer:
        """Load `tokenizer.json` (path to the file or to its directory). Special tokens not given
        here are read from `tokenizer_config.json` beside it, when there is one."""
        from tokenizers import Tokenizer  # the optional "hf" extra

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"no tokenizer file at {file}")
        special = _special_tokens(file.parent / "tokenizer_config.json")
        eos_token = eos_token or special.get("eos_token")
        if eos_token is None:
            raise ValueError(f"no EOS token for {file}: pass eos_token=... (no "
                             "tokenizer_config.json names one)")
        return cls(Tokenizer.from_file(str(file)), eos_token,
                   bos_token or special.get("bos_token"), pad_token or special.get("pad_token"))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> np.ndarray:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        head = [self.bos_id] if bos and self.bos_id is not None else []
        return np.asarray(head + ids + ([self.eos_id] if eos else []), np.int32)

    def decode(self, ids, skip_special: bool = True) -> str:
        # tokenizers drops unknown ids silently (and overflows on negative ones); like
        # CharTokenizer, show each as U+FFFD and decode the valid runs between them.
        # skip_special also drops the pad/bos/eos ids, even if the file does not mark them special.
        roles = {self.pad_id, self.bos_id, self.eos_id} if skip_special else set()
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


def _special_tokens(config_file: Path) -> dict[str, str]:
    """bos/eos/pad token strings from a transformers tokenizer_config.json (missing: {})."""
    if not config_file.exists():
        return {}
    config = json.loads(config_file.read_text())
    out = {}
    for role in ("bos_token", "eos_token", "pad_token"):
        value = config.get(role)
        if isinstance(value, dict):  # older files: {"content": "<|endoftext|>", ...}
            value = value.get("content")
        if value:
            out[role] = value
    return out
