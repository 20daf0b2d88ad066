"""The tokenizer interface, and the character tokenizer the built-in tasks use.

`CharTokenizer` maps each character of a fixed alphabet to one id, after three special ids
(PAD=0, BOS=1, EOS=2). It is deliberately tiny: the built-in tasks use digits, a few operators
and letters, so the model's vocabulary (and its softmax) stays small and fast on a laptop CPU.
Characters outside the alphabet raise a clear error when encoding (the tasks generate only
known characters; model output is decoded, never encoded). A Hugging Face checkpoint's tokenizer
has the same interface (`minirl.hf.hf_tokenizer.HFTokenizer`).

Interface (both tokenizers):
    vocab_size: int; pad_id: int; eos_id: int (the one appended to demonstrations)
    eos_ids: tuple[int, ...] (every id that ends a completion; eos_id first)
    bos_id: int or None (None for models without a BOS token, e.g. Qwen)
    chat_template: str or None; apply_chat_template(messages, add_generation_prompt=True,
        tools=None, **kw) -> str
    encode(text, bos=True, eos=False) -> np.ndarray int32 [T]
    decode(ids, skip_special=True) -> str   (unknown ids decode to U+FFFD, never raise)
    max_token_chars: int (no token stands for more characters: a cheap bound on a text's tokens)
    vocabulary() -> dict[str, int] (every token's string and id: two tokenizers with equal
                    vocabularies read ids alike, what a distillation teacher needs)
    save(directory)
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
    """One id per character."""

    def __init__(self, alphabet: str = DEFAULT_ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet has repeated characters")
        self.alphabet = alphabet
        self._id = {ch: i + len(_SPECIALS) for i, ch in enumerate(alphabet)}
        self.pad_id, self.bos_id, self.eos_id, self.eos_ids = PAD, BOS, EOS, (EOS,)
        self.chat_template = None

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
        raise ValueError(
            "the character tokenizer has no chat template; set data.chat_template=false"
        )

    @property
    def vocab_size(self) -> int:
        return len(_SPECIALS) + len(self.alphabet)

    max_token_chars = 1

    def vocabulary(self) -> dict[str, int]:
        """Every token's string and id (the specials first), as `save` writes them."""
        return {s: i for i, s in enumerate(_SPECIALS)} | self._id

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> np.ndarray:
        try:
            ids = [self._id[ch] for ch in text]
        except KeyError as e:
            raise ValueError(
                f"character {e.args[0]!r} is not in the tokenizer's alphabet"
            ) from None
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

    def save(self, directory) -> None:
        """The same tokenizer as a `tokenizers` file (one token per character, BOS added by the
        post-processor), so a model trained on the built-in tasks exports to transformers too."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

        tok = Tokenizer(models.WordLevel(self.vocabulary(), unk_token=None))
        tok.add_special_tokens(list(_SPECIALS))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS)]
        )
        special = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
        write_files(directory, tok, {"tokenizer_class": "PreTrainedTokenizerFast", **special})


def write_files(directory, tokenizer, config: dict) -> None:
    """tokenizer.json (a `tokenizers.Tokenizer`) and tokenizer_config.json in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
