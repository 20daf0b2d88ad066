"""minirl's losses: RLAX Eq. 3 assembled from small parts, with the presets of the papers.

    from minirl.losses import LossInputs, get_preset, take_rows, finalize_metrics

    objective = get_preset("grpo")                  # or "dapo", "gspo_tis", "distill", ...
    prepared = objective.prepare(inputs)            # phase 1: whole train batch
    loss, m = objective.loss(logp[rows], take_rows(prepared, rows))   # phase 2: per micro-batch
    metrics = finalize_metrics([m, ...])

See objective.py for the two-phase contract, and docs/losses.md for every formula, the table of
presets and a worked example.
"""

from minirl.losses.advantages import (
    GAE,
    GroupMean,
    GroupNorm,
    GroupStats,
    LeaveOneOut,
    batch_whiten,
    gae,
    group_statistics,
    whiten,
)
from minirl.losses.aggregation import LastToken, MaxLength, SequenceMean, TokenMean
from minirl.losses.distill import Distill, teacher_log_ratio
from minirl.losses.importance import (
    ClippedTokenRatio,
    Correction,
    GeometricSequenceRatio,
    SequenceRatio,
    TokenRatio,
    TruncatedCorrection,
)
from minirl.losses.inputs import Context, LossInputs, Prepared, take_rows, validate_inputs
from minirl.losses.metrics import batch_statistics, finalize_metrics, merge_metrics
from minirl.losses.objective import Objective
from minirl.losses.presets import (
    PRESETS,
    get_preset,
    list_presets,
    make_objective,
    with_kl_coef,
    with_rejection,
    with_teacher,
    with_tis,
)
from minirl.losses.regularizers import K1KL, K2KL, K3KL, Entropy
from minirl.losses.rejection import SequenceReject, TokenReject, apply_rejection
from minirl.losses.terms import ClippedRatio, GSPOClipped, LogProb, SequenceLogProb, clip_mask

__all__ = [
    # the two-phase API
    "LossInputs",
    "Prepared",
    "Objective",
    "take_rows",
    "validate_inputs",
    "merge_metrics",
    "finalize_metrics",
    "batch_statistics",
    # presets
    "PRESETS",
    "get_preset",
    "list_presets",
    "make_objective",
    "with_tis",
    "with_rejection",
    "with_kl_coef",
    "with_teacher",
    # parts: aggregation
    "SequenceMean",
    "TokenMean",
    "MaxLength",
    "LastToken",
    # parts: importance weights
    "TokenRatio",
    "SequenceRatio",
    "ClippedTokenRatio",
    "GeometricSequenceRatio",
    "Correction",
    "TruncatedCorrection",
    # parts: advantages
    "GroupNorm",
    "GroupMean",
    "LeaveOneOut",
    "GAE",
    "batch_whiten",
    "gae",
    "group_statistics",
    "GroupStats",
    "whiten",
    "Distill",
    "teacher_log_ratio",
    # parts: gradient terms and regularisers
    "ClippedRatio",
    "LogProb",
    "SequenceLogProb",
    "GSPOClipped",
    "clip_mask",
    "K1KL",
    "K2KL",
    "K3KL",
    "Entropy",
    # parts: rejection
    "TokenReject",
    "SequenceReject",
    "apply_rejection",
    "Context",
]
