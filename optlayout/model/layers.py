"""What one transformer layer is, as far as its cost goes: an MoE layer or a dense one, windowed attention or not."""

from __future__ import annotations

from typing import NamedTuple


class LayerKind(NamedTuple):
    """The kind of one layer: `moe` (routed experts instead of a dense FFN), `windowed` (sliding-window attention)."""

    moe: bool = False
    windowed: bool = False


DENSE_LAYER = LayerKind()
