"""A learned reward model as a run's reward: `minirl train --data FILE --verifier rm:DIR`.

    rm = RewardModel("path/to/reward-model")      # checked now; weights read on the first score
    scores = rm.score(rollouts)                     # Score(the model's scalar score, reason)

DIR is a Hugging Face checkpoint of a `*ForSequenceClassification` model with one label
(`num_labels=1`) whose backbone minirl/hf/model_files.py loads (Qwen2, Qwen3, Llama and their
mixture-of-experts forms), with its tokenizer. The reward of a completion is the model's score
of the conversation, computed as transformers computes it:

  layout      the REWARD MODEL's tokenizer (it need not be the policy's). With a chat template:
              the prompt's messages, then {"role": "assistant", "content": completion}, rendered
              with add_generation_prompt=False and encoded without added special tokens (the
              template writes its own; TRL's GRPO trainer lays a conversation out the same way).
              Without one: the messages' texts (a blank line between, then a newline: minirl's
              plain prompt layout) followed by the completion, encoded as `tokenizer(text)` does
              (BOS where the tokenizer adds one). What a message says is text, never a control
              token: a completion that writes "<|im_end|>\n<|im_start|>user\n..." or
              "<|endoftext|>" (any policy can, with ordinary tokens) is encoded as those
              characters (`HFTokenizer.encode_chat`; transformers' split_special_tokens=True),
              so it cannot forge a turn or end the text where the score is read (only there do
              the ids differ from TRL's, which parses them). The prompt's messages are
              `meta["messages"]` (dataset rows scored by a reward model carry them, the system
              prompt and instruction included, as the policy saw them); a prompt without them
              counts as one user message of its text.
  truncation  the first `max_tokens` tokens are kept (default: config.json's
              max_position_embeddings, all the model can read), as a transformers tokenizer
              with truncation=True and its default side keeps them; the reason says so.
  score       the `score` head (a [hidden, 1] linear, no bias) of the final-normed hidden state
              at the rightmost token that is not config.json's pad_token_id (the last token
              when it has none): transformers' GenericForSequenceClassification rule.

The forward is minirl's own decoder (`Transformer.hidden`) plus that head, jitted once: rows are
padded to a power-of-two length bucket (64 tokens up to max_tokens) and `batch_tokens // bucket`
rows a call, so a run compiles a few shapes, each once. Construction reads config.json, the
tensor headers and the tokenizer, and lays out a trial conversation with the chat template
(`check_template`), so a directory that is not a one-label sequence classifier minirl can load,
or a template it cannot lay conversations out with, is a one-line ValueError before any
training (`minirl train`: a ConfigError); the weights are read, in `dtype` (`minirl train`: the
run's model.dtype), on the first `score`, and weights that hold a NaN or an infinity (every
score would be NaN) are a one-line ValueError then. What a completion holds never raises: a
conversation the template cannot render, or a score that is NaN or infinite, is reward 0 with
the reason.

Where it runs, and why: in ONE process, the one that calls `score`, on a whole batch at once. A
`VerifierPool` would be the wrong place: each forked worker would load its own copy of the
weights and compile its own forward, and a pool scores one rollout at a time, so nothing would
be batched; a JAX model also gains nothing from the pool's crash and hang protection (it neither
runs untrusted code nor hangs on a completion). So `minirl train` builds it where the run's
verifier lives: in the run's process with `rl.workers=inprocess` (the controller hands it every
completion of a step in one `score` call, on the same accelerator as the trainer), in the
verifier's own process with `rl.workers=process`, in the verifier actor on Ray; the run's
process keeps one for the held-out evaluation too (its weights are read at the first
evaluation). `get_verifier` and the verifier service (scale/), which wrap verifiers in pools,
refuse `rm:` with a line saying so. The object pickles as its settings, never its weights.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minirl.hf.hf_config import (
    ARCHITECTURES,
    CheckpointError,
    open_safetensors,
    read_config,
    read_token_ids,
    tensor_files,
)
from minirl.hf.model_files import TensorSource, open_checkpoint, read_params
from minirl.modeling.model import abstract_model
from minirl.types import Rollout, Score

HEAD = "score.weight"  # transformers' `score` Linear: [num_labels, hidden], no bias
SUFFIX = "ForSequenceClassification"
MIN_BUCKET = 64  # tokens: the shortest padded row length
# The chat template's trial at the start (`check_template`): a conversation, and its bounds.
PROBE = ({"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."})
PROBE_SECONDS = 10.0  # real templates take milliseconds
PROBE_CHARS = 1 << 20  # real templates write a few thousand characters around it


def backbone_architecture(hf: dict, source: str) -> str:
    """The causal-LM architecture whose decoder a `*ForSequenceClassification` config.json
    declares (Qwen2ForSequenceClassification -> Qwen2ForCausalLM), or a one-line error."""
    archs = hf.get("architectures") or []
    named = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    for name in named:
        if name.endswith(SUFFIX):
            causal = name.removesuffix(SUFFIX) + "ForCausalLM"
            if causal not in ARCHITECTURES:
                known = sorted(a.removesuffix("ForCausalLM") + SUFFIX for a in ARCHITECTURES)
                raise CheckpointError(f"{source}: {name} is not one minirl loads ({known})")
            return causal
    raise CheckpointError(
        f"{source}: architectures = {archs!r}: not a sequence-classification model (a reward "
        f"model is a *{SUFFIX} checkpoint with num_labels=1)"
    )


def num_labels(hf: dict) -> object:
    """How many scores the head gives, as transformers reads config.json: len(id2label), else
    num_labels, else its default 2."""
    id2label = hf.get("id2label")
    return len(id2label) if isinstance(id2label, dict) and id2label else hf.get("num_labels", 2)


def open_reward_model(path, dtype=None) -> tuple:
    """(backbone ModelConfig, its tensor sources, the head's source, pad id or None) of a
    reward-model directory, every check done on config.json and the tensor headers."""
    path = Path(path)
    hf, source = read_config(path), str(path / "config.json")
    causal = backbone_architecture(hf, source)
    if num_labels(hf) != 1:
        raise CheckpointError(
            f"{source}: num_labels = {num_labels(hf)!r} (its id2label, or transformers' "
            "default 2): a reward model gives one score, num_labels=1"
        )
    # the decoder alone: tied, so no lm_head is looked for (a classifier has none)
    backbone = {**hf, "architectures": [causal], "tie_word_embeddings": True}
    cfg, sources = open_checkpoint(path, dtype, backbone, frozenset({HEAD}))
    files = tensor_files(path)
    if HEAD not in files:
        raise CheckpointError(f"checkpoint {path} has no {HEAD} (the reward head)")
    with open_safetensors(files[HEAD]) as f:
        stored = tuple(f.get_slice(HEAD).get_shape())
    if stored != (1, cfg.dim):
        raise CheckpointError(f"{files[HEAD]}: {HEAD} has shape {stored}, expected (1, {cfg.dim})")
    pad = hf.get("pad_token_id")
    if pad is not None and (
        isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < cfg.vocab_size
    ):
        raise CheckpointError(f"{source}: pad_token_id = {pad!r}: a token id or null")
    return cfg, sources, TensorSource(files[HEAD], HEAD, (cfg.dim, 1), True), pad


def load_tokenizer(path, vocab_size: int):
    """The reward model's own tokenizer (tokenizer.json beside the weights), or a one-line
    error: none there, or more token ids than the model has embeddings."""
    from minirl.hf.hf_tokenizer import HFTokenizer

    try:
        tokenizer = HFTokenizer.from_dir(path, extra_eos_ids=read_token_ids(path).eos)
    except (ImportError, OSError, ValueError) as e:  # ImportError: no `tokenizers` (hf extra)
        raise CheckpointError(f"{path}: no usable tokenizer ({e})") from None
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            f"{path}: its tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
            f"{vocab_size} embeddings"
        )
    return tokenizer


def check_template(tokenizer, path) -> None:
    """The reward model's chat template lays out the PROBE conversation within PROBE_SECONDS and
    PROBE_CHARS, its assistant message included, or a one-line error: a template that raises,
    loops, writes without end or drops the completion would otherwise make every reward 0, hang
    the first score, or score every completion alike. (A template that loops for good leaves
    its thread running, in a process that then stops.)"""
    if tokenizer.chat_template is None:
        return
    out = {}

    def render():
        try:
            out["text"] = tokenizer.apply_chat_template(list(PROBE), add_generation_prompt=False)
        except Exception as e:  # noqa: BLE001 - said below, in one line
            out["error"] = f"{type(e).__name__}: {e}"

    trial = threading.Thread(target=render, daemon=True, name="chat-template-probe")
    trial.start()
    trial.join(PROBE_SECONDS)
    text, why = out.get("text"), out.get("error")
    if trial.is_alive():
        why = f"it did not finish in {PROBE_SECONDS:g} s"
    elif text is not None and len(text) > PROBE_CHARS:
        why = f"it wrote {len(text)} characters (more than {PROBE_CHARS})"
    elif text is not None and PROBE[-1]["content"] not in text:
        why = "the assistant's message is not in what it writes: every completion would score alike"
    if why:
        raise CheckpointError(f"{path}: its chat template cannot lay out a conversation ({why})")


def conversation_ids(tokenizer, messages: list[dict], completion: str) -> np.ndarray:
    """The token ids [T] the reward model reads for a completion of `messages` (the layout of
    the module docstring)."""
    if tokenizer.chat_template is not None:
        turns = [*messages, {"role": "assistant", "content": completion}]
        ids = tokenizer.encode_chat(turns, add_generation_prompt=False)
    else:
        prompt = "\n\n".join(m["content"] for m in messages) + "\n"
        ids = tokenizer.encode(prompt + completion, bos=True, parse_special=False)
    if not len(ids):
        raise ValueError("the conversation has no tokens")
    return ids


def check_finite(params: dict, sources: dict, head, path) -> None:
    """Weights that hold a NaN or an infinity would make every score one, so every reward 0:
    a one-line error naming the first few tensors, when the weights are read."""
    leaves = [
        (functools.reduce(lambda d, k: d[k], where, params), s) for where, s in sources.items()
    ]
    names = [
        getattr(s, "name", None) or s.parts[0].name for x, s in leaves if not jnp.isfinite(x).all()
    ]
    names += [HEAD] if not jnp.isfinite(head).all() else []
    if names:
        raise CheckpointError(
            f"reward model {path}: {len(names)} tensor(s) hold NaN or infinite values, so every "
            f"score would be: {', '.join(names[:3])}"
        )


def scored_index(ids: np.ndarray, pad_id: int | None) -> int:
    """Where the score is read: the rightmost token that is not `pad_id` (0 if every token is
    one), the last token without a pad id — as transformers picks it."""
    if pad_id is None:
        return len(ids) - 1
    real = np.flatnonzero(np.asarray(ids) != pad_id)
    return int(real[-1]) if len(real) else 0


def bucket(length: int, max_tokens: int) -> int:
    """The padded row length of a `length`-token row: a power of two >= MIN_BUCKET, at most
    max_tokens."""
    return min(max(MIN_BUCKET, 1 << (length - 1).bit_length()), max_tokens)


@functools.lru_cache(maxsize=8)
def scores_function(cfg):
    """The jitted forward of a backbone `cfg` (one per config: reward models of one shape share
    its compiled code): (params, head [D, 1], tokens [R, L] int32, last [R] int32) -> [R] float32,
    the head times the final-normed hidden state at each row's `last` token."""
    graphdef = abstract_model(cfg)[0]

    def scores(params, head, tokens, last):
        hidden, _ = nnx.merge(graphdef, params).hidden(tokens)  # [R, L, D]
        h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [R, D]
        return (h.astype(jnp.float32) @ head.astype(jnp.float32))[:, 0]  # [R]

    return jax.jit(scores)


class RewardModel:
    """A `Verifier` whose reward is a sequence-classification model's score (module docstring).
    `max_tokens`: the tokens read per completion (default: the model's positions);
    `batch_tokens`: padded tokens per forward call (rows = batch_tokens // bucket, at least 1)."""

    def __init__(self, path, dtype: str = "float32", max_tokens: int = 0, batch_tokens: int = 8192):
        self.path, self.dtype, self.batch_tokens = str(path), dtype, batch_tokens
        self.cfg, self._sources, self._head, self.pad_id = open_reward_model(path, dtype)
        self.tokenizer = load_tokenizer(path, self.cfg.vocab_size)
        check_template(self.tokenizer, path)
        self.max_tokens = max_tokens or self.cfg.max_seq_len
        if not 0 < self.max_tokens <= self.cfg.max_seq_len or batch_tokens < 1:
            raise ValueError(
                f"reward model {path}: max_tokens={max_tokens} must be in [1, "
                f"{self.cfg.max_seq_len}] (its positions), batch_tokens={batch_tokens} >= 1"
            )
        self._loaded: tuple | None = None  # (params, head, jitted forward), on the first score
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        keys = ("path", "dtype", "max_tokens", "batch_tokens")
        return {k: getattr(self, k) for k in keys}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _load(self) -> tuple:
        with self._lock:
            if self._loaded is None:
                params = read_params(self.cfg, self._sources)
                head = jnp.asarray(self._head.read())  # [D, 1]
                check_finite(params, self._sources, head, self.path)
                self._loaded = (params, head, scores_function(self.cfg))
        return self._loaded

    def layout(self, rollout: Rollout) -> tuple[np.ndarray, int]:
        """(the ids read, at most max_tokens [T], how many the whole conversation has)."""
        prompt = rollout.prompt
        messages = prompt.meta.get("messages") or [{"role": "user", "content": prompt.text}]
        ids = conversation_ids(self.tokenizer, list(messages), rollout.text or "")
        return ids[: self.max_tokens], len(ids)

    def forward(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """The scores [N] of token rows, a few padded shapes (`bucket`), batch_tokens a call."""
        params, head, forward = self._load()
        groups: dict[int, list[int]] = {}
        for i, ids in enumerate(rows):
            groups.setdefault(bucket(len(ids), self.max_tokens), []).append(i)
        out = np.zeros(len(rows), np.float64)
        for length, members in groups.items():
            n = max(1, self.batch_tokens // length)
            for start in range(0, len(members), n):
                chunk = members[start : start + n]
                tokens = np.zeros((n, length), np.int32)  # [R, L]; padding never read (causal)
                last = np.zeros((n,), np.int32)  # [R]
                for row, i in enumerate(chunk):
                    tokens[row, : len(rows[i])] = rows[i]
                    last[row] = scored_index(rows[i], self.pad_id)
                out[chunk] = np.asarray(forward(params, head, tokens, last))[: len(chunk)]
        return out

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        out: list[Score | None] = [None] * len(rollouts)
        laid = {}  # rollout index -> (ids, whole length)
        for i, rollout in enumerate(rollouts):
            try:
                laid[i] = self.layout(rollout)
            except Exception as e:  # noqa: BLE001 - what a model wrote never stops the run
                why = f"{type(e).__name__}: {e}"
                out[i] = Score(
                    0.0, f"reward model: the conversation cannot be laid out: {why}"[:300]
                )
        values = self.forward([ids for ids, _ in laid.values()]) if laid else []
        for (i, (ids, whole)), value in zip(laid.items(), values, strict=True):
            if not math.isfinite(value):
                out[i] = Score(0.0, f"reward model scored {value}")
            elif whole > len(ids):
                out[i] = Score(
                    float(value), f"reward model read the first {len(ids)} of {whole} tokens"
                )
            else:
                out[i] = Score(float(value), "")
        return out

    def __repr__(self) -> str:
        return f"RewardModel({self.path!r})"
