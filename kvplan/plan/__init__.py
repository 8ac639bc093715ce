"""The plan: `estimate`, from a request to memory per GPU, KV pool, concurrency and speed.

Owns the Plan record and estimate() (plan.py) and CPU weight offload (offload.py). May import
every stage below it: base, kvplan.specs, kvplan.model, kvplan.calibrate, kvplan.request,
kvplan.engines, kvplan.speed.
"""
