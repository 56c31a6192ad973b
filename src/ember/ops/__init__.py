"""All tensor ops, one module per family (the Tensor methods that call them: ember/_tensor_*.py)."""

from __future__ import annotations

from ember.ops import (
    conv,
    creation,
    elementwise,
    index,
    linalg,
    movement,
    pool,
    random,
    reduce,
    rope,
)
from ember.ops._util import cast, to_device
from ember.ops.conv import *  # noqa: F403
from ember.ops.creation import *  # noqa: F403
from ember.ops.elementwise import *  # noqa: F403
from ember.ops.index import *  # noqa: F403
from ember.ops.linalg import *  # noqa: F403
from ember.ops.movement import *  # noqa: F403
from ember.ops.pool import *  # noqa: F403
from ember.ops.random import *  # noqa: F403
from ember.ops.reduce import *  # noqa: F403
from ember.ops.rope import *  # noqa: F403
