"""A decoder's shapes and numerics (`ModelConfig`) and the named presets (`ModelConfig.preset`):
the small config module the run's config (minirl/config.py) and the planner read without building
a model. The model itself is minirl/modeling/model.py; the MoE and LoRA knobs are checked by
minirl/modeling/moe.py and lora.py."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from minirl.modeling import lora, moe

__all__ = ["PRESETS", "ModelConfig"]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a decoder. Presets: `ModelConfig.preset(name)`."""

    vocab_size: int = 64  # V: token ids the embedding and the output layer cover
    dim: int = 256  # D
    num_layers: int = 4  # L
    num_heads: int = 4  # H
    num_kv_heads: int = 2  # K
    head_dim: int = 64  # Dh
    mlp_dim: int = 768  # F
    rope_theta: float = 10000.0  # RoPE base: the longest rotary wavelength
    rope_scaling: tuple | None = None  # Llama-3: (factor, low_freq, high_freq, original_max_len)
    norm_eps: float = 1e-6  # RMSNorm's epsilon (added to the mean square)
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    tie_embeddings: bool = True  # the output layer reuses the input embedding matrix
    max_seq_len: int = 512  # positions the model serves (prompt + completion)
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"  # storage dtype
    path: str = (
        ""  # a Hugging Face checkpoint directory: the shapes above come from its config.json
    )
    lora_rank: int = (
        0  # LoRA adapters' rank r on the targeted projections; 0 = off (full fine-tune)
    )
    lora_alpha: float = 32.0  # LoRA scale numerator: the adapter product counts alpha / r
    lora_targets: tuple[str, ...] = (  # which projections get adapters (q, k, v, o, gate, up, down)
        "q",
        "k",
        "v",
        "o",
        "gate",
        "up",
        "down",
    )
    lora_dropout: float = 0.0  # LoRA: drop adapter inputs w.p. p in the training forward; 0 = off
    # Mixture of experts (minirl/modeling/moe.py, docs/moe.md); num_experts = 0: dense model.
    num_experts: int = 0  # E routed experts per MoE layer; 0 = a dense MLP in every layer
    experts_per_token: int = 2  # k: each token goes to the top-k experts of the router's softmax
    expert_dim: int = 0  # each expert's SwiGLU width (HF moe_intermediate_size); 0 = mlp_dim
    shared_expert_dim: int = 0  # a sigmoid-gated shared expert's width (Qwen2-MoE); 0 = none
    norm_topk_prob: bool = True  # renormalise the k chosen probabilities to sum 1 (Qwen3-MoE)
    moe_every: int = 1  # layer i is MoE when (i + 1) % moe_every == 0 (HF decoder_sparse_step)
    dense_layers: tuple[
        int, ...
    ] = ()  # layers kept dense (mlp_dim MLP) anyway (HF mlp_only_layers)

    def __post_init__(self):
        for name in (
            "vocab_size",
            "dim",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "mlp_dim",
            "max_seq_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ValueError(
                f"rope_theta and norm_eps must be > 0, got {self.rope_theta}, {self.norm_eps}"
            )
        scaling = self.rope_scaling
        if scaling is not None and not (len(scaling) == 4 and all(x > 0 for x in scaling)):
            raise ValueError(
                "rope_scaling must be None or four positive numbers (factor, "
                f"low_freq, high_freq, original_max_len), got {scaling}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}"
                )
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE rotates pairs)")
        lora.check(self.lora_rank, self.lora_alpha, tuple(self.lora_targets), self.lora_dropout)
        if self.num_experts:
            if not self.expert_dim:  # resolved here, so overrides may come in any order
                object.__setattr__(self, "expert_dim", self.mlp_dim)
            moe.check(self)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the MoE layers, in order (M of them; empty on a dense model)."""
        every, dense = self.moe_every, set(self.dense_layers)
        return tuple(
            i
            for i in range(self.num_layers)
            if self.num_experts and (i + 1) % every == 0 and i not in dense
        )

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def storage_dtype(self):
        return _DTYPES[self.param_dtype]

    def num_params(self, embeddings: bool = True, experts: int | None = None) -> int:
        """Parameters the model stores (every expert); `experts`: count that many per MoE layer
        instead (`active_params` passes k)."""
        d, h, k, dh, f = self.dim, self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_dim
        attn = d * h * dh * 2 + d * k * dh * 2 + (h + 2 * k) * dh * self.qkv_bias
        block = attn + 2 * d + 2 * dh * self.qk_norm
        e = self.num_experts if experts is None else experts
        s = self.shared_expert_dim
        sparse = d * self.num_experts + 3 * e * d * self.expert_dim + (3 * d * s + d) * (s > 0)
        m = len(self.moe_layers)
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        mlps = (self.num_layers - m) * 3 * d * f + m * sparse
        return self.num_layers * block + mlps + d + (emb if embeddings else 0)

    def active_params(self, embeddings: bool = True) -> int:
        """Parameters one token's forward uses: the router, k experts and the shared expert of
        each MoE layer (= num_params on a dense model)."""
        return self.num_params(embeddings, experts=self.experts_per_token)

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)


PRESETS: dict[str, ModelConfig] = {
    # ~3.2M parameters: fast on a 2-core CPU, the default for built-in tasks.
    "tiny": ModelConfig(),
    # ~25M parameters: the mid-size model for benchmarks.
    "small": ModelConfig(
        dim=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        mlp_dim=1536,
        vocab_size=512,
        max_seq_len=1024,
    ),
    # A tiny mixture of experts (8 experts, 2 per token, 2 layers): tests and the MoE lesson.
    "tiny-moe": ModelConfig(  # q/k norm: exports as Qwen3MoeForCausalLM
        dim=64, num_layers=2, head_dim=16, mlp_dim=128, num_experts=8, expert_dim=64, qk_norm=True
    ),
    # Exact shapes of public checkpoints (their config.json values).
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=151936,
        dim=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=4864,
        rope_theta=1e6,
        norm_eps=1e-6,
        qkv_bias=True,
        tie_embeddings=True,
        max_seq_len=32768,
        dtype="bfloat16",
        param_dtype="bfloat16",
    ),
    "qwen3-0.6b": ModelConfig(
        vocab_size=151936,
        dim=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=3072,
        rope_theta=1e6,
        norm_eps=1e-6,
        qk_norm=True,
        tie_embeddings=True,
        max_seq_len=40960,
        dtype="bfloat16",
        param_dtype="bfloat16",
    ),
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256,
        dim=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        mlp_dim=8192,
        rope_theta=5e5,
        rope_scaling=(32.0, 1.0, 4.0, 8192),
        norm_eps=1e-5,
        tie_embeddings=True,
        max_seq_len=131072,
        dtype="bfloat16",
        param_dtype="bfloat16",
    ),
}
PRESETS["qwen3-30b-a3b"] = dataclasses.replace(  # Qwen3-0.6B's vocabulary, RoPE, norms, dtypes
    PRESETS["qwen3-0.6b"],
    dim=2048,
    num_layers=48,
    num_heads=32,
    num_kv_heads=4,
    mlp_dim=6144,
    tie_embeddings=False,
    num_experts=128,
    experts_per_token=8,
    expert_dim=768,
)
