"""Token-budget micro-batches: which rows of a train batch go through the model together.

A train batch may be too big for one forward/backward pass, and its rows have very different
lengths. AReaL (§6 and its Algorithm 1, "dynamic batching") packs whole sequences into
micro-batches under a token budget with first-fit decreasing: sort sequences longest first, put
each into the first micro-batch that still has room, open a new one when none has. The gradient
is then accumulated over the micro-batches; with minirl's two-phase loss (minirl/losses) the sum
over any partition of the rows is exactly the full-batch gradient.

One adaptation: AReaL packs sequences padding-free (concatenated, with a segment mask), so a
micro-batch costs its number of tokens. minirl's model reads right-padded rows, so a micro-batch
of n rows costs n x (its longest row, rounded up to a bucket length). Because rows arrive longest
first, a micro-batch's length is fixed by the row that opens it, and "room" means a row count:
at most `capacity(length) = largest power of two with rows x length <= budget`.

Bounded compiles: a micro-batch is an array of shape [R, Tb] where Tb is a bucket length and R a
power of two (the last micro-batch is padded with empty rows up to one), so a run compiles at most
(number of buckets) x log2(budget) shapes, and in practice a few.

Pure numpy, no JAX: the trainer gathers each micro-batch on the host and hands it to its jitted
functions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from minirl.training.batching import bucket_length


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where a packed micro-batch's rows sit: row j of `MicroBatch.rows` fills positions
    offset[j] .. offset[j] + its length - 1 of packed row slot[j], of `shape` [P, L]."""

    slot: np.ndarray  # [n] packed row of each member
    offset: np.ndarray  # [n] its first position there
    shape: tuple[int, int]  # (P, L): P rounded by `_round_rows`, L the micro-batch's length


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Rows of the batch processed together, and the padded shape they are processed in."""

    rows: np.ndarray  # [n] int indices into the batch, longest first
    num_rows: int  # R >= n: rows after padding with empty ones (a power of two)
    length: int  # Tb: positions kept (a bucket length; later positions hold no counted target)
    packing: Packing | None = None  # the model runs on packed rows [P, L] (`pack_sequences`)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.length)

    @property
    def padded_tokens(self) -> int:
        """Positions the model runs: R x Tb, or P x L when packed."""
        if self.packing is not None:
            return self.packing.shape[0] * self.packing.shape[1]
        return self.num_rows * self.length


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


def _round_rows(n: int) -> int:
    """n packed rows rounded up to four steps per doubling (5, 6, 7, 8, 10, 12, 14, 16, 20, ...):
    a few shapes, and little padding (a power of two would undo the packing's saving)."""
    step = max(1, _floor_pow2(n) // 4)
    return -(-n // step) * step


def pack_sequences(
    lengths: np.ndarray,
    token_budget: int,
    bucket_minimum: int = 32,
    max_length: int | None = None,
    rows: np.ndarray | None = None,
) -> list[MicroBatch]:
    """`pack_rows`' micro-batches, each run on packed rows (AReaL's padding-free packing, kept
    within bucket lengths): its rows, longest first, go first-fit into packed rows of its
    length L = Tb, so two rows of 40 share one packed row of 96 where `pack_rows` pads both to
    96. P packed rows (`_round_rows`, P <= R) cost P x L positions instead of R x Tb. Each row
    sits at its own positions 0, 1, ... behind a block-diagonal causal mask (`packing_arrays`),
    and its log-probs come back in the [R, Tb] row layout the loss reads."""
    out = []
    for mb in pack_rows(lengths, token_budget, bucket_minimum, max_length, rows):
        fill: list[int] = []  # positions used in each packed row
        slot, offset = [], []
        for r in mb.rows.tolist():
            n = int(lengths[r])
            p = next((i for i, used in enumerate(fill) if used + n <= mb.length), len(fill))
            if p == len(fill):
                fill.append(0)
            slot.append(p)
            offset.append(fill[p])
            fill[p] += n
        shape = (min(_round_rows(len(fill)), mb.num_rows), mb.length)
        out.append(
            dataclasses.replace(mb, packing=Packing(np.array(slot), np.array(offset), shape))
        )
    return out


def packed_inputs(x: np.ndarray, mb: MicroBatch, lengths: np.ndarray) -> np.ndarray:
    """A per-position [B, T] array laid out in the micro-batch's packed rows: [P, L] (0 where
    no row sits)."""
    x = np.asarray(x)
    out = np.zeros(mb.packing.shape, x.dtype)
    for r, p, o in zip(mb.rows, mb.packing.slot, mb.packing.offset, strict=True):
        n = int(lengths[r])
        out[p, o : o + n] = x[r, :n]
    return out


def packing_arrays(mb: MicroBatch, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """What the packed forward needs: positions and segment ids [P, L] (segment 0: no row),
    and `source` [R, Tb], each row-layout position's flat index into [P x L] (-1: none)."""
    p_rows, length = mb.packing.shape
    positions = np.zeros((p_rows, length), np.int32)
    segments = np.zeros((p_rows, length), np.int32)
    source = np.full((mb.num_rows, mb.length), -1, np.int32)
    for j, (r, p, o) in enumerate(zip(mb.rows, mb.packing.slot, mb.packing.offset, strict=True)):
        n = int(lengths[r])
        positions[p, o : o + n] = np.arange(n)
        segments[p, o : o + n] = j + 1
        source[j, :n] = p * length + o + np.arange(n)
    return {"positions": positions, "segments": segments, "source": source}
