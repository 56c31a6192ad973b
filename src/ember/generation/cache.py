"""The KV cache and causal mask now live in ``ember.nn`` (``ember.nn.kv_cache``), attention over
the cache in ``ember.nn.functional.cached_attention``; re-exported here for existing imports."""

from ember.nn.functional.attention import cached_attention
from ember.nn.kv_cache import CausalMask, KVCache

__all__ = ["KVCache", "CausalMask", "cached_attention"]
