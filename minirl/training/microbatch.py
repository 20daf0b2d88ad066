"""Token-budget micro-batches: which rows of a train batch go through the model together.

AReaL (§6, Algorithm 1) packs whole sequences into micro-batches under a token budget, first-fit
decreasing; with minirl's two-phase loss (minirl/losses) any partition of the rows gives exactly
the full-batch gradient. `pack_rows` pads: n rows cost n x Tb (Tb the longest, bucketed), so
"room" is a row count, a power of two with rows x Tb <= budget. `pack_sequences` lays the rows
side by side in packed rows (AReaL's padding-free packing). Few shapes, so few compiles. Numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from minirl.training.batching import bucket_length


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Rows of the batch processed together, and the padded shape they are processed in."""

    rows: np.ndarray  # [n] int indices into the batch, longest first
    num_rows: int  # R >= n: rows after padding with empty ones (a power of two)
    length: int  # Tb: positions kept (a bucket length; later positions hold no counted target)
    packing: tuple | None = None  # (slot [n], offset [n], P): `pack_sequences`
    prompts: tuple | None = None  # (src [n], U, Tp, Tc): `share_prompts`

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.length)

    @property
    def padded_tokens(self) -> int:
        if self.prompts:  # each distinct prompt once, then every row's completion
            _, u, tp, tc = self.prompts
            return u * tp + self.num_rows * tc
        return (self.packing[2] if self.packing else self.num_rows) * self.length


def row_lengths(mask: np.ndarray) -> np.ndarray:
    """Positions each row needs: 1 + the last position with mask > 0 (0 for a row without
    completion targets). Positions after it cannot change any counted log-prob (the model is
    causal), so a micro-batch may drop them.  [B, T] -> [B]"""
    mask = np.asarray(mask)
    t = mask.shape[1]
    has = mask.max(axis=1) > 0
    last = t - 1 - np.argmax(mask[:, ::-1] > 0, axis=1)
    return np.where(has, last + 1, 0).astype(np.int64)


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _ceil_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pack_rows(
    lengths: np.ndarray,
    token_budget: int,
    bucket_minimum: int = 32,
    max_length: int | None = None,
    rows: np.ndarray | None = None,
) -> list[MicroBatch]:
    """First-fit-decreasing packing of whole rows under `token_budget` padded tokens.

    lengths [B]: from `row_lengths`. `rows` (default: all) selects the rows to pack, e.g. a PPO
    mini-batch. `max_length` caps the bucketed length (the batch's own T). Every selected row
    lands in exactly one micro-batch; a micro-batch holds R x Tb <= token_budget padded tokens,
    except that a single row longer than the budget gets a micro-batch of its own.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lengths = np.asarray(lengths)
    rows = np.arange(len(lengths)) if rows is None else np.asarray(rows)
    if len(rows) == 0:
        return []
    order = rows[np.argsort(-lengths[rows], kind="stable")]  # longest first, ties by index

    def bucket(n: int) -> int:
        b = bucket_length(n, bucket_minimum)
        return b if max_length is None else min(b, max_length)

    bins: list[tuple[int, int, list[int]]] = []  # (length Tb, capacity, rows)
    for r in order.tolist():
        for tb, cap, members in bins:  # first fit
            if len(members) < cap and lengths[r] <= tb:
                members.append(r)
                break
        else:  # no room anywhere: open a micro-batch sized by this (longest remaining) row
            tb = bucket(int(lengths[r]))
            bins.append((tb, _floor_pow2(token_budget // tb), [r]))
    return [
        MicroBatch(np.asarray(members, np.int64), min(_ceil_pow2(len(members)), cap), tb)
        for tb, cap, members in bins
    ]


def gather(x: np.ndarray, mb: MicroBatch, fill=0) -> np.ndarray:
    """The micro-batch's slice of a per-row array, padded with `fill`:
    [B, T, ...] -> [R, Tb, ...], or [B] -> [R]."""
    x = np.asarray(x)
    n = len(mb.rows)
    if x.ndim == 1:
        out = np.full((mb.num_rows,), fill, x.dtype)
        out[:n] = x[mb.rows]
        return out
    out = np.full((mb.num_rows, mb.length, *x.shape[2:]), fill, x.dtype)
    width = min(mb.length, x.shape[1])
    out[:n, :width] = x[mb.rows, :width]
    return out


def scatter(values: np.ndarray, mb: MicroBatch, out: np.ndarray) -> None:
    """Write a micro-batch's [R, Tb] results back into rows of the batch-shaped `out` [B, T]."""
    n = len(mb.rows)
    width = min(mb.length, out.shape[1])
    out[mb.rows, :width] = np.asarray(values)[:n, :width]


def pack_sequences(lengths: np.ndarray, *args, **kwargs) -> list[MicroBatch]:
    """`pack_rows(lengths, ...)` with each micro-batch's rows first-fit (longest first) in packed
    rows of its length Tb, each from position 0: P x Tb positions run, not R x Tb."""
    out = []
    for mb in pack_rows(lengths, *args, **kwargs):
        fill, slot, offset = [], [], []  # fill: positions used in each packed row
        for n in lengths[mb.rows].tolist():
            p = next((i for i, used in enumerate(fill) if used + n <= mb.length), len(fill))
            fill += [0] * (p == len(fill))
            slot, offset, fill[p] = slot + [p], offset + [fill[p]], fill[p] + n
        step = max(1, _floor_pow2(len(fill)) // 4)  # P at four sizes per doubling: few shapes
        p_rows = min(-(-len(fill) // step) * step, mb.num_rows)
        out.append(dataclasses.replace(mb, packing=(np.array(slot), np.array(offset), p_rows)))
    return out


def packed(mb: MicroBatch, lengths: np.ndarray, tokens, targets) -> dict[str, np.ndarray]:
    """Tokens, targets, positions, segments (0: none) [P, Tb]; source [R, Tb] (flat, -1: none)."""
    slot, offset, p_rows = mb.packing
    out = {k: np.zeros((p_rows, mb.length), np.int32) for k in ("tokens", "targets", "positions")}
    out["segments"], out["source"] = np.zeros_like(out["tokens"]), np.full(mb.shape, -1, np.int32)
    for j, (r, p, o) in enumerate(zip(mb.rows, slot, offset, strict=True)):
        n, at = int(lengths[r]), slice(o, o + int(lengths[r]))
        out["tokens"][p, at], out["targets"][p, at] = tokens[r, :n], targets[r, :n]
        out["positions"][p, at], out["segments"][p, at] = np.arange(n), j + 1
        out["source"][j, :n] = p * mb.length + o + np.arange(n)
    return out


def prompt_lengths(mask: np.ndarray) -> np.ndarray:
    """1 + the first position with mask > 0 (it reads the prompt's last token): [B, T] -> [B]."""
    mask = np.asarray(mask) > 0
    return np.where(mask.any(axis=1), np.argmax(mask, axis=1) + 1, 1).astype(np.int64)


def share_prompts(
    tokens, mask, token_budget: int, bucket_minimum=32, rows=None
) -> list[MicroBatch]:
    """Micro-batches of U distinct prompts [U, Tp] and their R rows' completions [R, Tc] (U, R
    powers of two; U x Tp + R x Tc <= token_budget, but one row always fits), rows in batch
    order: a group (contiguous there) splits only where the budget says so (docs/trainer.md)."""
    lengths, plen = row_lengths(mask), prompt_lengths(mask)
    tail = np.maximum(lengths - plen, 0)  # completion tokens a row reads after its prompt
    rows = np.arange(len(lengths)) if rows is None else np.asarray(rows)
    key = {r: tokens[r, : plen[r]].tobytes() for r in rows.tolist()}  # each row's prompt, once
    out, members, keys = [], [], {}

    def cost(members, keys):  # (padded tokens, Tp, Tc)
        tp, tc = (bucket_length(max(x[members].max(), 1), bucket_minimum) for x in (plen, tail))
        return _ceil_pow2(len(keys)) * tp + _ceil_pow2(len(members)) * tc, tp, tc

    def close(members, keys):
        info = (
            np.array([keys[key[r]] for r in members]),
            _ceil_pow2(len(keys)),
            *cost(members, keys)[1:],
        )
        return MicroBatch(np.array(members), _ceil_pow2(len(members)), mask.shape[1], prompts=info)

    for r in rows.tolist():
        grown = {**keys, key[r]: keys.get(key[r], len(keys))}
        if members and cost(members + [r], grown)[0] > token_budget:
            out, members, grown = [*out, close(members, keys)], [], {key[r]: 0}
        members, keys = members + [r], grown
    return out + ([close(members, keys)] if members else [])


def shared(mb: MicroBatch, tokens, targets, mask) -> dict[str, np.ndarray]:
    """`share_prompts`' inputs (what `forward._shared_hidden` reads): prompts [U, Tp] and their
    lengths [U], src [R] (each row's prompt), tokens [R, Tc] (after the prompt), targets
    [R, 1 + Tc] (from the prompt's last position), source [R, Tb] (flat into [R, 1 + Tc])."""
    src, u, tp, tc = mb.prompts
    plen, (r_, t_) = prompt_lengths(mask), mb.shape
    out = dict(prompts=np.zeros((u, tp), np.int32), prompt_lengths=np.ones(u, np.int32))
    out.update(src=np.zeros(r_, np.int32), tokens=np.zeros((r_, tc), np.int32))
    out.update(targets=np.zeros((r_, 1 + tc), np.int32), source=np.full((r_, t_), -1, np.int32))
    for j, (r, k) in enumerate(zip(mb.rows, src, strict=True)):
        p, n = int(plen[r]), min(tc, tokens.shape[1] - int(plen[r]))
        out["prompts"][k, :p], out["prompt_lengths"][k], out["src"][j] = tokens[r, :p], p, k
        out["tokens"][j, :n], out["targets"][j, : n + 1] = (
            tokens[r, p : p + n],
            targets[r, p - 1 : p + n],
        )
        width = min(1 + tc, t_ - p + 1)
        out["source"][j, p - 1 : p - 1 + width] = j * (1 + tc) + np.arange(width)
    return out
