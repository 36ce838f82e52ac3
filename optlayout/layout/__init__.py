"""What a layout is: its axes (declared once, on the `Layout` model), its text form, its stage split, its
rank order and its legality rules.

    axes.py    Axis: how each field is written, searched and placed; Megatron's rank orders
    model.py   Layout, Sharding, Recompute; AXES, GRID_AXES, SEARCHED_AXES
    text.py    parse_layout / format_layout
    stages.py  split_layers (the one split policy), stage_layer_counts, virtual chunks
    ranks.py   RankMap: Megatron's rank order, used by the cost model, the launchers and the reports
    rules.py   layout_problems and the rules the space, explain, launchers and the diagnosis read
"""

from optlayout.layout.axes import Axis
from optlayout.layout.model import AXES, GRID_AXES, SEARCHED_AXES, Layout, Recompute, Sharding
from optlayout.layout.ranks import COSTED_ORDER, DEFAULT_ORDER, ORDERS, RankMap, rank_map
from optlayout.layout.rules import check_layout, layout_problems
from optlayout.layout.stages import split_layers, stage_layer_counts, stage_split
from optlayout.layout.text import format_layout, parse_layout

__all__ = [
    "AXES",
    "COSTED_ORDER",
    "DEFAULT_ORDER",
    "GRID_AXES",
    "ORDERS",
    "SEARCHED_AXES",
    "Axis",
    "Layout",
    "RankMap",
    "Recompute",
    "Sharding",
    "check_layout",
    "format_layout",
    "layout_problems",
    "parse_layout",
    "rank_map",
    "split_layers",
    "stage_layer_counts",
    "stage_split",
]
