"""Parts of a model shape beyond the dense decoder block: mixture-of-experts layers and attention variants.

`ModelSpec` (optlayout.specs) composes them and derives every parameter count from the whole shape.
"""

from optlayout.model.attention import AttentionSpec
from optlayout.model.layers import DENSE_LAYER, LayerKind
from optlayout.model.moe import MoeSpec, parse_layer_freq

__all__ = ["DENSE_LAYER", "AttentionSpec", "LayerKind", "MoeSpec", "parse_layer_freq"]
