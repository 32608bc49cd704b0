"""Corrections and extensions of Keras' internals, each narrow and version-guarded.

`fixes` corrects keras#20585 and keras#19246 for the Keras versions it was checked with;
`accumulation` wraps an optimizer for gradient accumulation (clipping on the all-reduced
gradient); `loss_scaling` is the LossScaleOptimizer used with mixed_float16.
"""
