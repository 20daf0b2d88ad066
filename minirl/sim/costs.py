"""What each part's work costs on a device: the roofline, plus what a call costs besides.

Every duration in the simulator comes from here (issue #17):

    decode chunk   n steps of `rows` sequences: each step moves the weights and the KV cache
                   of the context once and does 2 x params FLOPs per row (+ attention); with
                   experts, the bytes are every expert's and the FLOPs the active params';
                   time = max(bytes / (bandwidth x eff), FLOPs / (peak x eff)) per step
    prefill call   rows x length tokens: the same two terms for one pass
    train step     (6 + 2) x active params x tokens / (devices x peak x MFU): forward + backward, and
                   the recompute of log pi_prox (one more forward)
    weight reload  parameter bytes / link bandwidth
    + a fixed overhead per call (dispatch, host work: what dominates a tiny model on a CPU)

An engine replica of d devices splits the weights d ways (tensor parallel, no communication
cost counted: an optimistic bound). The numbers of a device preset are its datasheet's; `this
machine` is measured (minirl.sim.calibrate), and so is a device calibrated from the
accelerator check's JSON (minirl.sim.measured_device). Efficiencies are knobs, not facts,
unless measured.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from minirl.modeling.model_config import PRESETS, ModelConfig

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU machine): its peak rates and the costs around a call."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes_per_s: float  # memory bandwidth
    hbm_bytes: float  # memory per device
    link_bytes_per_s: float  # how fast a replica receives new weights
    source: str = ""  # where the figures come from
    decode_eff: float = 0.7  # share of the roofline a decode step reaches
    mfu: float = 0.4  # share of peak a train step reaches
    call_s: float = 0.0  # fixed cost of an engine call (a decode chunk or a prefill)
    train_call_s: float = 0.0  # fixed cost of a train step
    itemsize: int = 2  # bytes per parameter (bf16)
    # Measured (minirl.sim.measured_device): decode efficiency at given slot counts,
    # ((slots, eff), ...) ascending, and the prefill's; empty / None: decode_eff for both.
    decode_eff_at: tuple[tuple[int, float], ...] = ()
    prefill_eff: float | None = None

    def decode_eff_for(self, rows: int) -> float:
        """The share of the roofline a decode step of `rows` slots reaches: `decode_eff`, or
        the measured one, linear in log2(slots) between measured slot counts and the nearest
        measured value outside them."""
        at = self.decode_eff_at
        if not at:
            return self.decode_eff
        if rows <= at[0][0]:
            return at[0][1]
        for (n0, e0), (n1, e1) in zip(at[:-1], at[1:], strict=True):
            if rows <= n1:
                share = math.log2(rows / n0) / math.log2(n1 / n0)
                return e0 + (e1 - e0) * share
        return at[-1][1]


# Datasheet figures (dense bf16; HBM bandwidth; HBM per chip; inter-chip link per chip).
DEVICES: dict[str, Device] = {
    "v5e": Device(
        "TPU v5e",
        197e12,
        819 * GB,
        16 * GB,
        1600e9 / 8,
        "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 819 GB/s HBM2, 16 GB, ICI 1,600 Gbps",
    ),
    "v5p": Device(
        "TPU v5p",
        459e12,
        2765 * GB,
        95 * GB,
        4800e9 / 8,
        "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 2,765 GB/s HBM2e, 95 GB, ICI 4,800 Gbps",
    ),
    "h100": Device(
        "H100 SXM",
        989e12,
        3350 * GB,
        80 * GB,
        900 * GB,
        "NVIDIA H100 datasheet: 989 TFLOP/s bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3, "
        "80 GB, NVLink 900 GB/s",
    ),
    "h200": Device(
        "H200 SXM",
        989e12,
        4800 * GB,
        141 * GB,
        900 * GB,
        "NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense (1,979 with sparsity), 4.8 TB/s HBM3e, "
        "141 GB, NVLink 900 GB/s",
    ),
}

# Shapes of public checkpoints the planner knows besides minirl.modeling.model_config.PRESETS (config.json).
SHAPES: dict[str, ModelConfig] = {
    **PRESETS,
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064,
        dim=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        mlp_dim=18944,
        qkv_bias=True,
        tie_embeddings=False,
        max_seq_len=32768,
    ),
    "qwen2.5-32b": ModelConfig(
        vocab_size=152064,
        dim=5120,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=27648,
        qkv_bias=True,
        tie_embeddings=False,
        max_seq_len=32768,
    ),
}


@functools.cache
def matrices(cfg: ModelConfig, experts: int | None = None) -> list[tuple[int, int]]:
    """(in, out) of every matmul in one token's forward, in order, the LM head last. An MoE
    layer has its router, `experts` experts (default: the k a token uses) and its shared
    expert (with its gate) if any."""
    d, h, k, dh, f = cfg.dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    attn = [(d, h * dh), (d, k * dh), (d, k * dh), (h * dh, d)]
    fe, s = cfg.expert_dim, cfg.shared_expert_dim
    n = cfg.experts_per_token if experts is None else experts
    sparse = [(d, cfg.num_experts)] + [(d, fe), (d, fe), (fe, d)] * n
    sparse += [(d, s), (d, s), (s, d), (d, 1)] if s else []
    out = []
    for i in range(cfg.num_layers):
        out += attn + (sparse if i in cfg.moe_layers else [(d, f), (d, f), (f, d)])
    return out + [(d, cfg.vocab_size)]


@functools.cache
def matmul_params(cfg: ModelConfig) -> int:
    """Parameters a token's forward multiplies by (the LM head included, the lookup not): with
    experts, the active ones — what sets the FLOPs."""
    return sum(a * b for a, b in matrices(cfg))


@functools.cache
def stored_matmul_params(cfg: ModelConfig) -> int:
    """The matrices' parameters with every expert: what a replica stores, reloads and (a decode
    step of many rows touches every expert) reads."""
    return sum(a * b for a, b in matrices(cfg, cfg.num_experts))


def attention_flops(cfg: ModelConfig, new: float, context: float) -> float:
    """QK^T and PV of `new` query positions over `context` keys each."""
    return 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * new * context


def kv_bytes(cfg: ModelConfig, positions: float, itemsize: int) -> float:
    return positions * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize


def weight_bytes(cfg: ModelConfig, itemsize: int, rows: int) -> float:
    """Every matrix once (every expert), the embedding rows looked up, the LM head whole."""
    return itemsize * (stored_matmul_params(cfg) + rows * cfg.dim)


@dataclasses.dataclass(frozen=True)
class Costs:
    """Durations of one model's work on replicas of `engine_devices` and a trainer of
    `trainer_devices` devices of type `device`."""

    model: ModelConfig
    device: Device
    engine_devices: int = 1  # devices per engine replica
    trainer_devices: int = 1

    def _roofline(self, nbytes: float, flops: float, devices: int, eff: float) -> float:
        d = self.device
        return max(nbytes / d.hbm_bytes_per_s, flops / d.peak_flops) / (devices * eff)

    def decode_chunk(self, rows: int, context: float, steps: int) -> float:
        """`steps` decode steps of `rows` slots at mean `context` positions each."""
        m, item = self.model, self.device.itemsize
        nbytes = weight_bytes(m, item, rows) + kv_bytes(m, rows * (context + 1), item)
        flops = 2.0 * rows * matmul_params(m) + attention_flops(m, rows, context)
        eff = self.device.decode_eff_for(rows)
        return self.device.call_s + steps * self._roofline(nbytes, flops, self.engine_devices, eff)

    def prefill(self, rows: int, length: int) -> float:
        m, item = self.model, self.device.itemsize
        tokens = rows * length
        nbytes = weight_bytes(m, item, tokens) + kv_bytes(m, tokens, item)
        flops = 2.0 * tokens * matmul_params(m) + attention_flops(m, tokens, length / 2)
        eff = self.device.prefill_eff or self.device.decode_eff
        return self.device.call_s + self._roofline(nbytes, flops, self.engine_devices, eff)

    def train_step(self, tokens: int) -> float:
        """Forward + backward (6 P T) and the recompute of log pi_prox (2 P T)."""
        d = self.device
        flops = 8.0 * matmul_params(self.model) * tokens
        return d.train_call_s + flops / (self.trainer_devices * d.peak_flops * d.mfu)

    def reload(self) -> float:
        """A replica receives the new weights (each replica from its own link, in parallel)."""
        nbytes = weight_bytes(self.model, self.device.itemsize, 0)
        return nbytes / (self.device.link_bytes_per_s * self.engine_devices)

    def replica_devices_needed(self, cache_tokens: int) -> int:
        """Fewest devices (a power of two) whose memory holds the weights and the KV cache."""
        m, item = self.model, self.device.itemsize
        need = weight_bytes(m, item, 0) + kv_bytes(m, cache_tokens, item)
        d = 1
        while d * self.device.hbm_bytes < need:
            d *= 2
        return d
