"""bf16 mixed precision (minirl/run/precision.py, `exact.dense`): bf16 products summed in
float32, float32 master weights and optimizer state, float32 logits; every dense dot runs in
YNNPACK (none left to XLA's Eigen kernel, none upcast to float32); the compute dtype a user's
model gets on this machine.

The train step reuses tests/training/test_trainer.py's tiny model, batch and settings (the
same compiled shapes); the float32 step is its `full_step`.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_trainer import CFG, GRAD_CFG, _tree_max_diff, batch, full_step, params  # noqa: F401

from minirl.losses import get_preset
from minirl.modeling import exact
from minirl.modeling.model import init_model
from minirl.run import precision
from minirl.training.trainer import Trainer, TrainerConfig

BF16 = dataclasses.replace(CFG, dtype="bfloat16")  # float32 weights (param_dtype), bf16 compute


def _dots(fn, *args) -> list[tuple[str, tuple[str, ...]]]:
    """(kernel, operand dtypes) of every dot in the compiled `fn`: "ynn" for a YNNPACK fusion,
    "xla" for a dot XLA runs itself (its Eigen kernel)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    dtypes = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))
    fused = set(re.findall(r"kind=k\w+, calls=%([\w.\-]+)", text))
    out, computation = [], None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(", line)
        if head:
            computation = head.group(1)
        call = re.search(r"= \w+\[[\d,]*\]\{[\d,]*\} (fusion|dot)\(([^)]*)\)", line)
        if computation in fused or not call:
            continue
        if call.group(1) == "fusion" and "__ynn_fusion" not in line:
            continue
        operands = tuple(dtypes[name] for name in re.findall(r"%([\w.\-]+)", call.group(2)))
        out.append(("ynn" if "__ynn_fusion" in line else "xla", operands))
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_dense_dot_runs_in_ynnpack_in_its_own_dtype(dtype):
    """Two dense layers and their gradient: the first forward, both weight gradients and both
    input gradients (the second forward is dead: the loss is linear in it), all five in
    YNNPACK, operands in the compute dtype. Before, XLA ran the weight gradients (x^T dy) with its Eigen kernel, built
    for AVX without FMA, and upcast every bf16 dot with a bf16 result to float32."""
    x = jnp.ones((4, 64, 32), dtype)  # [B, T, D]
    w1, w2 = jnp.ones((32, 96), jnp.float32), jnp.ones((96, 32), jnp.float32)  # float32 masters
    c = jnp.asarray(np.random.default_rng(0).normal(size=(4, 64, 32)), jnp.float32)
    loss = lambda x, w1, w2, c: (exact.dense(exact.dense(x, w1), w2, out_dtype=c.dtype) * c).sum()
    dots = _dots(jax.grad(loss, argnums=(0, 1, 2)), x, w1, w2, c)
    want = "bf16" if dtype == "bfloat16" else "f32"
    assert len(dots) == 5 and all(d == ("ynn", (want, want)) for d in dots), dots


def test_bf16_products_are_summed_in_float32():
    """dense(x bf16, w float32): y is the float32 sum of the bf16 products, rounded once to bf16
    (or kept float32 with out_dtype); the weight's gradient is float32, x's bf16."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 5, 200)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(200, 24)), jnp.float32)
    dy = jnp.asarray(rng.normal(size=(3, 5, 24)), jnp.float32)
    w16 = w.astype(jnp.bfloat16).astype(jnp.float32)  # what the products see
    ref = jnp.einsum("bti,io->bto", x.astype(jnp.float32), w16)  # exact products, f32 sums
    got = exact.dense(x, w, out_dtype=jnp.float32)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)  # f32 sums, any order
    assert (exact.dense(x, w) == ref.astype(jnp.bfloat16)).mean() > 0.95  # one rounding
    dx, dw = jax.grad(lambda x, w: (exact.dense(x, w, out_dtype=jnp.float32) * dy).sum(), (0, 1))(
        x, w
    )
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    dy16 = dy.astype(jnp.bfloat16).astype(jnp.float32)  # the cotangent enters in bf16
    want_dw = jnp.einsum("bti,bto->io", x.astype(jnp.float32), dy16)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5)


def test_bf16_step_keeps_float32_weights_and_follows_the_float32_step(
    params,  # noqa: F811  (test_trainer's fixtures)
    batch,  # noqa: F811
    full_step,  # noqa: F811
):
    """model.dtype=bfloat16 over float32 weights: the weights and Adam's moments stay float32,
    the logits are float32 (not on the bf16 grid), and the update follows the float32 step's
    (measured: 2.9e-2 of its size at most, from the bf16 rounding of activations)."""
    f32, _ = full_step
    trainer = Trainer(
        BF16, params, get_preset("grpo"), TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    )
    trainer.train_step(batch)
    state = trainer.state_dict()
    assert {x.dtype for x in jax.tree.leaves(state["params"])} == {np.dtype(np.float32)}
    moments = state["opt_state"][1]
    assert {x.dtype for x in jax.tree.leaves((moments.mu, moments.nu))} == {np.dtype(np.float32)}
    moved = _tree_max_diff(f32.params(), params)
    assert _tree_max_diff(trainer.params(), f32.params()) < 0.06 * moved
    logits = init_model(BF16)(jnp.asarray(batch.tokens[:2]))
    on_grid = logits == logits.astype(jnp.bfloat16).astype(jnp.float32)
    assert logits.dtype == jnp.float32 and on_grid.mean() < 0.1


def test_a_user_models_compute_dtype_follows_the_cpu(monkeypatch):
    """bf16 where the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16), else float32;
    MINIRL_COMPUTE_DTYPE pins it (the suite pins float32: tests/conftest.py)."""
    amd = "processor : 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
    intel = "flags : fpu avx512f amx_tile amx_bf16 amx_int8\n"
    old = "flags : fpu avx2 fma avx512f\n"
    assert "avx512_bf16" in precision.cpu_flags(amd) and not precision.cpu_flags("")
    for text, want in ((amd, "bfloat16"), (intel, "bfloat16"), (old, "float32")):
        monkeypatch.setattr(precision, "cpu_flags", lambda text=text: frozenset(text.split()))
        precision.native_bf16.cache_clear()
        monkeypatch.delenv(precision.PIN, raising=False)
        assert precision.fastest_compute_dtype() == want
        monkeypatch.setenv(precision.PIN, "float32")
        assert precision.fastest_compute_dtype() == "float32"
    precision.native_bf16.cache_clear()
    monkeypatch.setenv(precision.PIN, "float16")
    with pytest.raises(ValueError, match="MINIRL_COMPUTE_DTYPE must be float32 or bfloat16"):
        precision.fastest_compute_dtype()
