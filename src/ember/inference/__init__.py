"""The one inference rewrite: ``optimize_for_inference(model)``.

Passes run in order over the module tree; each is a function ``pass(model) -> model`` in its own
module here: stacking linears that share an input (q/k/v, gate/up), BatchNorm folding,
channels-last layout and weight packing. The result computes the same function as the model.
"""
