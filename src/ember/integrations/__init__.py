"""ember inside other systems' runtimes: `ember.integrations.ray` (Ray Serve and Ray Data).

Nothing here is imported by `import ember`; each integration imports its system lazily.
"""
