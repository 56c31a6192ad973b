"""ember.nn.functional (import as F): torch.nn.functional over ember ops and fused Functions."""

from ember.nn.functional import _dropout, activation, attention, gated, layers, loss, norm
from ember.nn.functional._dropout import *  # noqa: F403
from ember.nn.functional.activation import *  # noqa: F403
from ember.nn.functional.attention import *  # noqa: F403
from ember.nn.functional.gated import *  # noqa: F403
from ember.nn.functional.layers import *  # noqa: F403
from ember.nn.functional.loss import *  # noqa: F403
from ember.nn.functional.norm import *  # noqa: F403
from ember.ops.attention import varlen_attn

__all__ = [
    *_dropout.__all__,
    *activation.__all__,
    *attention.__all__,
    *gated.__all__,
    *layers.__all__,
    *loss.__all__,
    *norm.__all__,
    "varlen_attn",
]
