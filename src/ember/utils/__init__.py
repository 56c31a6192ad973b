"""torch.utils look-alike: ``ember.utils.data`` is ``ember.data`` under torch's name.

``from ember.utils.data import DataLoader, Dataset`` and ``import ember.utils.data`` give the
very modules of ember.data (one set of classes, not a copy), its sub-modules included.
"""

import sys

from ember import data

for _name, _module in list(sys.modules.items()):
    if _name == "ember.data" or _name.startswith("ember.data."):
        sys.modules["ember.utils" + _name[len("ember") :]] = _module
del _name, _module

__all__ = ["data"]
