"""Tests for minirl/modeling/tokenizer.py: CharTokenizer and the Hugging Face tokenizer.json adapter.

The adapter is tested on tokenizers built here with the `tokenizers` library: a byte-level BPE
trained on a few lines (round-trips any text, including characters it never saw) and a
WordLevel vocabulary; both saved as tokenizer.json and loaded back through `HFTokenizer`.
"""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from minirl.hf.hf_tokenizer import HFTokenizer
from minirl.modeling.tokenizer import BOS, EOS, PAD, CharTokenizer

SPECIALS = ["<pad>", "<bos>", "<eos>"]
TEXTS = [
    "the cat sat on the mat",
    "12+7=19",
    "  spaces,\ttabs\nand newlines ",
    "ünïcödé → 漢字 🙂",
    "",
]


def test_char_round_trip():
    tok = CharTokenizer()
    text = "what is 12+7? answer: 19\n"
    ids = tok.encode(text, eos=True)
    assert ids.dtype == np.int32
    assert ids[0] == BOS and ids[-1] == EOS and len(ids) == len(text) + 2
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=False) == "<bos>" + text + "<eos>"
    assert tok.encode("ab", bos=False).tolist() == [
        tok.encode("a", bos=False)[0],
        tok.encode("b", bos=False)[0],
    ]
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (PAD, BOS, EOS)
    assert tok.vocab_size == 3 + len(tok.alphabet)


def test_char_errors():
    tok = CharTokenizer("ab")
    with pytest.raises(ValueError, match="'Z' is not in the tokenizer's alphabet"):
        tok.encode("aZ")
    with pytest.raises(ValueError, match="repeated characters"):
        CharTokenizer("aa")
    assert tok.decode([3, 4, 99, 0]) == "ab\ufffd"  # unknown ids never raise; pad is skipped


def _write(path, tok, config):
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # A post-processor that adds <bos>: encode(bos=True) applies it, as transformers does.
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the cat sat on the mat", "hello world 12+7=19"] * 3, trainer)
    config = {"eos_token": "<eos>", "bos_token": "<bos>", "pad_token": "<pad>"}
    return _write(tmp_path_factory.mktemp("bpe"), tok, config)


def test_hf_bpe_round_trip(bpe_dir):
    tok = HFTokenizer.from_dir(bpe_dir)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.eos_ids) == (0, 1, 2, (2,))
    assert tok.vocab_size == Tokenizer.from_file(str(bpe_dir / "tokenizer.json")).get_vocab_size()
    for text in TEXTS:
        ids = tok.encode(text, eos=True)
        assert ids.dtype == np.int32
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert tok.bos_id not in ids[1:].tolist()
        assert tok.decode(ids) == text
    assert tok.encode("the cat", bos=False)[0] != tok.bos_id
    assert len(tok.encode("the cat sat", bos=False)) < len("the cat sat")  # merges happened
    assert tok.decode(tok.encode("hi", eos=True), skip_special=False) == "<bos>hi<eos>"


def test_hf_special_tokens_from_config_and_defaults(bpe_dir, tmp_path):
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    tok.post_processor = None  # a Qwen-like file: no BOS token, nothing added
    config = {"eos_token": {"content": "<eos>"}, "bos_token": None}
    hf = HFTokenizer.from_dir(_write(tmp_path, tok, config))
    assert (hf.pad_id, hf.bos_id, hf.eos_id) == (2, None, 2)  # pad falls back to EOS
    assert hf.encode("the cat", bos=True).tolist() == hf.encode("the cat", bos=False).tolist()
    # No eos_token in the config: the first of generation_config's EOS ids stands in.
    hf = HFTokenizer.from_dir(_write(tmp_path / "noeos", tok, {}), extra_eos_ids=(2, 0))
    assert hf.eos_ids == (2, 0) and hf.eos_id == 2


def test_hf_errors(bpe_dir, tmp_path):
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    with pytest.raises(ValueError, match="no EOS token"):
        HFTokenizer.from_dir(_write(tmp_path / "a", tok, {}))
    with pytest.raises(ValueError, match="eos_token '<end>' is not in the tokenizer's vocabulary"):
        HFTokenizer.from_dir(_write(tmp_path / "b", tok, {"eos_token": "<end>"}))
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        HFTokenizer.from_dir(tmp_path / "nowhere")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a tokenizers file"):
        HFTokenizer.from_dir(tmp_path / "c")
    hf = HFTokenizer.from_dir(bpe_dir)
    ids = hf.encode("the cat", bos=False).tolist()
    # Model output may hold ids the tokenizer lacks (padded vocabularies): shown, never raised.
    assert hf.decode([*ids, hf.vocab_size + 5, -1, *ids]) == "the cat\ufffd\ufffdthe cat"


def test_hf_word_level(tmp_path):
    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", "two", "plus", "is"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    hf = HFTokenizer.from_dir(_write(tmp_path, tok, {"eos_token": "<eos>", "pad_token": "<pad>"}))
    ids = hf.encode("two plus two is", eos=True)
    assert ids.tolist() == [4, 5, 4, 6, 2]  # no BOS: the file has no post-processor adding one
    assert hf.decode(ids) == "two plus two is"
    assert hf.encode("two minus", bos=False).tolist() == [4, 3]  # unknown word -> <unk>
