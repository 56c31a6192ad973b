"""The meta backend: zero-stride numpy arrays that carry shape and dtype but no data.

``ember.autograd.meta_array(shape, dtype)`` builds one; ``Function.apply`` runs an op's
``meta`` shape rule (or its forward on meta arrays, which costs no memory for the inputs)
and wraps the result again as a meta array.
"""

from ember.autograd import meta_array

__all__ = ["meta_array"]
