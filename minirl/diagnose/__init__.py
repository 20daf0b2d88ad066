"""Training-inference mismatch, one source at a time: RLAX's Fig. 5 / VeXact's ablations in miniature.

    minirl diagnose [--preset NAME] [--set KEY=VALUE ...] [--fast]
    python -m scale.diagnose --cpu-devices 4 [...]      # + the "sharding" source (scale/)

generates ONE set of rollouts with the engine in its production setting (fast reductions, the
model's dtype), then scores those same tokens in several ways and prints, per mismatch source,
mean / p95 / max of |log p_a - log p_b| over the completion tokens:

  source     rows (a vs b)                                         what it isolates
  recompute  engine log mu vs trainer recompute                    decode vs full forward (what the
                                                                   controller logs as mismatch/*)
             bypass: training forward vs engine log mu             the PPO ratio's first value when
             recompute: training forward vs recomputed prox         prox = mu vs prox recomputed
                                                                   (VeXact §4.1; RLAX §5.1)
  graph      training forward, remat none|dots|nothing, vs         RLAX's "inference-matched graph":
             recompute; exact training forward vs exact decode     does the remat policy move logits?
  batch      recompute in the batch vs each sequence alone,        batch-variant reductions (VeXact
             padded to twice the length (fast, then exact)         §3.1)
  dtype      bf16 engine decode vs fp32 trainer recompute (fast,   the engine's dtype; with exact on
             then exact on both sides)                              both sides it is the dtype alone
  exact      exact decode vs exact recompute, fp32 and bf16        must be 0 (the zero-mismatch path)
  routing    (MoE models) engine log mu vs the trainer's          R3: what replaying the engine's
             recompute with free routing (the label gives the     experts removes; the rest is
             share of tokens whose top-k expert set differs)      the rest of the mismatch
             and with the engine's routes replayed
  sharding   (scale/) the recompute on an FSDP mesh and the        RLAX's "divergent parallelism";
             decode on a tensor-parallel mesh vs one device and    its exact row must be 0 (exact
             vs each other, fast and exact                         mode's tree is layout-invariant)

`--fast` (CI) keeps one row per source: the fixture preset, 4 prompts.

  replay.py    the engine's decode replayed with teacher forcing; the training step's forward
  table.py     the sides, the sources (a registry: `register_source`), `diagnose`, the table
  command.py   the `minirl diagnose` command line

The same two comparisons as the "recompute" rows are logged every training step by the trainer
(train/dlogp_recompute/*, train/dlogp_no_recompute/*; `minirl plot` draws them as RLAX Fig. 5).
"""

from minirl.diagnose.command import add_diagnose_arguments, add_diagnose_parser, cmd_diagnose
from minirl.diagnose.replay import decode_logprobs, train_forward_logprobs
from minirl.diagnose.table import (
    BUILTIN_SOURCES,
    ENGINE,
    EXTRA_SOURCES,
    Context,
    Decode,
    Recompute,
    Row,
    Train,
    builtin_rows,
    diagnose,
    format_table,
    generate_rollouts,
    register_source,
    source_names,
)

__all__ = [
    "BUILTIN_SOURCES",
    "ENGINE",
    "EXTRA_SOURCES",
    "Context",
    "Decode",
    "Recompute",
    "Row",
    "Train",
    "add_diagnose_arguments",
    "add_diagnose_parser",
    "builtin_rows",
    "cmd_diagnose",
    "decode_logprobs",
    "diagnose",
    "format_table",
    "generate_rollouts",
    "register_source",
    "source_names",
    "train_forward_logprobs",
]
