"""Speed: the decode step model and its inputs from a planned cluster.

Owns the step model (step_model.py: time per decode step, term by term, from bytes, layers and
links; its fitted coefficients, kvplan/data/decode_fit.yaml) and the step model's inputs for one
plan (plan_speed.py: Decode, Prefill). kvplan.simulator builds on both. May import: the
base modules, kvplan.specs, kvplan.model, kvplan.calibrate (the profile), kvplan.request,
kvplan.engines; never kvplan.plan (the plan imports this).
"""
