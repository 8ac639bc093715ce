"""The model's arithmetic: from a ModelSpec to bytes and counts.

Owns number formats' use on a model (kv.py: KV bytes per token and per request), parameter counts
(params.py), weight bytes per GPU and per stage (weights.py), how layers and heads split over
TP x PP (parallel.py), and KV pools: blocks, fragmentation, prefix caching, the mean context a
pool holds (capacity.py). May import: the base modules and kvplan.specs.
"""
