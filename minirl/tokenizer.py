"""Tokenizers with one small interface: a character tokenizer for the built-in tasks.

`CharTokenizer` maps each character of a fixed alphabet to one id, after three special ids
(PAD=0, BOS=1, EOS=2). It is deliberately tiny: the built-in tasks use digits, a few operators
and letters, so the model's vocabulary (and its softmax) stays small and fast on a laptop CPU.
Characters outside the alphabet raise a clear error when encoding (the tasks generate only
known characters; model output is decoded, never encoded).
"""

from __future__ import annotations

import string

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
