"""The stage split: how a model's layers spread over pipeline stages and their virtual chunks. One policy,
`split_layers`, which the space searches, the cost model costs and the launchers emit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from functools import lru_cache
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from optlayout.layout.model import Layout

K = TypeVar("K", bound=Hashable)
ChunkKinds = tuple[tuple[K, int], ...]


def split_layers(layers: int, pp: int) -> tuple[int | None, int | None] | None:
    """A Megatron-expressible split of `layers` over `pp` stages: (first, last) layer counts, None for even.

    Even when `pp` divides `layers`; else the smallest middle stage m >= layers / pp that leaves the first
    and last stages between them no more than 2m layers, split as evenly as it goes with the spare layer on the
    first stage (the last also runs the output layer and the loss), as `--decoder-first/last-pipeline-num-
    layers` express: 126 layers on 16 stages = 7, 8 x 14, 7; 61 on 4 = 15, 16, 16, 14. None when no split
    exists (returned as the bare None, distinct from `(None, None)`).
    """
    if pp == 1 or layers % pp == 0:
        return (None, None)
    for middle in range(-(-layers // pp), layers):
        rest = layers - middle * (pp - 2)
        if rest < 2:
            return None
        if rest <= 2 * middle:
            return rest - rest // 2, rest // 2
    return None


def stage_layer_counts(layers: int, pp: int, first: int | None = None, last: int | None = None) -> list[int]:
    """Transformer layers on each pipeline stage; ValueError when the split is impossible.

    Given first/last counts, the rest split evenly over the middle stages. Otherwise `split_layers`'s split.
    """
    if pp == 1:
        return [layers]
    if first is None and last is None:
        split = split_layers(layers, pp)
        if split is None:
            raise ValueError(f"{layers} layers cannot be split over {pp} stages with equal middle stages")
        first, last = split
        if first is None:
            return [layers // pp] * pp
    fixed = (first or 0) + (last or 0)
    free_stages = pp - (first is not None) - (last is not None)
    rest = layers - fixed
    if rest < 0 or (free_stages and rest % free_stages) or (not free_stages and rest):
        raise ValueError(f"{layers} layers cannot be split over {pp} stages with first={first}, last={last}")
    mid = rest // free_stages if free_stages else 0
    if free_stages and mid < 1:
        raise ValueError(f"{layers} layers leave no layer for the middle stages with first={first}, last={last}")
    return [first if first is not None else mid] + [mid] * (pp - 2) + [last if last is not None else mid]


def stage_split(layout: Layout, layers: int) -> list[int]:
    """The layers on each pipeline stage of `layout` (ValueError when impossible)."""
    return stage_layer_counts(layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers)


def vp_fits(counts: list[int] | set[int], vp: int) -> bool:
    """Whether `vp` virtual chunks per stage are legal: the fullest stages split into `vp` equal chunks, so
    they pace the interleaved schedule; lighter first/last stages get lighter chunks (`chunk_layer_counts`,
    emitted as Megatron's `--pipeline-model-parallel-layout` or torchtitan's module lists)."""
    fullest = max(counts)
    return fullest % vp == 0 and fullest >= vp


def chunk_layer_counts(counts: list[int], vp: int) -> list[int]:
    """Layers of each virtual stage in model order (stage s runs on pp rank s % pp as its chunk s // pp).

    Each rank's layers spread as evenly as its `vp` chunks allow; the first rank's lighter chunks come first
    (next to the embedding), the others' last (the last rank's next to the loss), as Llama 3 405B's
    pipeline does: 126 layers, pp 16, vp 8 leave the first chunk the embedding and the last the loss.
    """
    pp = len(counts)
    per_rank = [rank_chunk_sizes(n, vp, first=r == 0) for r, n in enumerate(counts)]
    return [per_rank[s % pp][s // pp] for s in range(pp * vp)]


def warmup_chunks(pp: int, vp: int, stage: int = 0) -> int:
    """Chunk forwards pipeline stage `stage` runs before its first backward, with enough micro-batches: Megatron's
    1F1B warm-up of pp - stage micro-batches, interleaved (pp - stage - 1) * 2 + (vp - 1) * pp + 1 chunks."""
    return pp - stage if vp == 1 else (pp - stage - 1) * 2 + (vp - 1) * pp + 1


def rank_chunk_sizes(layers: int, vp: int, first: bool) -> list[int]:
    """One rank's `layers` over its `vp` chunks, as even as possible; lighter chunks first on the first rank."""
    small, extra = divmod(layers, vp)
    sizes = [small] * (vp - extra) + [small + 1] * extra
    return sizes if first else sizes[::-1]


def rank_layers(layers: int, layout: Layout) -> list[list[range]]:
    """For each pipeline rank, the model layers (0-based indices) of each of its virtual chunks, in the order the
    rank holds them: virtual stage s, the s-th block of `chunk_layer_counts` in model order, runs on rank s % pp."""
    sizes = chunk_layer_counts(stage_split(layout, layers), layout.vp)
    out: list[list[range]] = [[] for _ in range(layout.pp)]
    start = 0
    for s, n in enumerate(sizes):
        out[s % layout.pp].append(range(start, start + n))
        start += n
    return out


def rank_chunk_kinds(kinds: tuple[K, ...], layout: Layout) -> tuple[tuple[ChunkKinds[K], ...], ...]:
    """For each pipeline rank and each of its virtual chunks, how many layers of each kind it holds (sorted
    (kind, count) pairs), given every layer's kind in model order; cached per split."""
    return _rank_chunk_kinds(kinds, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers)


@lru_cache(maxsize=4096)
def _rank_chunk_kinds(
    kinds: tuple[K, ...], pp: int, vp: int, first: int | None, last: int | None
) -> tuple[tuple[ChunkKinds[K], ...], ...]:
    from optlayout.layout.model import Layout

    split = Layout.unchecked(pp=pp, vp=vp, first_stage_layers=first, last_stage_layers=last)
    return tuple(
        tuple(tuple(sorted(Counter(kinds[j] for j in chunk).items())) for chunk in chunks)
        for chunks in rank_layers(len(kinds), split)
    )


def rank_kinds(kinds: tuple[K, ...], layout: Layout) -> tuple[ChunkKinds[K], ...]:
    """For each pipeline rank, how many layers of each kind it holds over all its chunks; cached per split."""
    return _rank_kinds(kinds, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers)


@lru_cache(maxsize=4096)
def _rank_kinds(
    kinds: tuple[K, ...], pp: int, vp: int, first: int | None, last: int | None
) -> tuple[ChunkKinds[K], ...]:
    out = []
    for chunks in _rank_chunk_kinds(kinds, pp, vp, first, last):
        held: Counter[K] = Counter()
        for chunk in chunks:
            held.update(dict(chunk))
        out.append(tuple(sorted(held.items())))
    return tuple(out)


def recomputed_in_chunk(chunk_layers: int, recompute_layers: int | None) -> int:
    """Layers of a model chunk that full recomputation re-runs: Megatron's block method recomputes the first
    `recompute_layers` of each chunk (a TransformerBlock: one virtual stage) and keeps every activation of the
    rest (transformer_block.py `_checkpointed_forward`); None recomputes them all."""
    return chunk_layers if recompute_layers is None else min(recompute_layers, chunk_layers)


def rank_chunk_recomputed(
    kinds: tuple[K, ...], layout: Layout
) -> tuple[tuple[tuple[ChunkKinds[K], ChunkKinds[K]], ...], ...]:
    """For each pipeline rank and each of its virtual chunks: (the kinds of the layers full recomputation re-runs,
    the kinds of the layers it keeps whole), as `recomputed_in_chunk` splits the chunk; cached per split."""
    return _rank_chunk_recomputed(kinds, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers,
                                  layout.recompute_layers)  # fmt: skip


@lru_cache(maxsize=4096)
def _rank_chunk_recomputed(
    kinds: tuple[K, ...], pp: int, vp: int, first: int | None, last: int | None, recompute_layers: int | None
) -> tuple[tuple[tuple[ChunkKinds[K], ChunkKinds[K]], ...], ...]:
    from optlayout.layout.model import Layout

    def counts(layers: range) -> ChunkKinds[K]:
        return tuple(sorted(Counter(kinds[j] for j in layers).items()))

    split = Layout.unchecked(pp=pp, vp=vp, first_stage_layers=first, last_stage_layers=last)
    out = []
    for chunks in rank_layers(len(kinds), split):
        cuts = [(c, c.start + recomputed_in_chunk(len(c), recompute_layers)) for c in chunks]
        out.append(tuple((counts(range(c.start, cut)), counts(range(cut, c.stop))) for c, cut in cuts))
    return tuple(out)


def rank_recomputed_kinds(kinds: tuple[K, ...], layout: Layout) -> tuple[ChunkKinds[K], ...]:
    """For each pipeline rank, how many layers of each kind full recomputation re-runs over all its chunks; cached
    per split."""
    return _rank_recomputed_kinds(kinds, layout.pp, layout.vp, layout.first_stage_layers, layout.last_stage_layers,
                                  layout.recompute_layers)  # fmt: skip


@lru_cache(maxsize=4096)
def _rank_recomputed_kinds(
    kinds: tuple[K, ...], pp: int, vp: int, first: int | None, last: int | None, recompute_layers: int | None
) -> tuple[ChunkKinds[K], ...]:
    out = []
    for chunks in _rank_chunk_recomputed(kinds, pp, vp, first, last, recompute_layers):
        held: Counter[K] = Counter()
        for recomputed, _ in chunks:
            held.update(dict(recomputed))
        out.append(tuple(sorted(held.items())))
    return tuple(out)


def recomputed_share(layers: int, layout: Layout) -> float:
    """The share of the model's layers that full recomputation re-runs (1 for all)."""
    if layout.recompute_layers is None:
        return 1.0
    kinds = (None,) * layers
    return sum(n for chunks in rank_chunk_recomputed(kinds, layout) for rec, _ in chunks for _, n in rec) / layers
