"""Specs: files and the Hub into ModelSpec and GpuSpec, validated once at this edge.

Owns the records (models.py on record.py), their validation with pydantic (schema.py, loaded on
first use; bounds from kvplan.limits), reading files (io.py), the shipped and user specs
(registry.py), the Hub (hub.py) and Hugging Face config.json readers (hf/), and a model's weight
matrices as checkpoints name them (matrices.py). May import only the base modules (kvplan.errors,
kvplan.limits, kvplan.units, kvplan.formats, kvplan.userdata) and the shipped data.
"""
