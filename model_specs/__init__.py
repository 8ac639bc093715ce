"""Shipped model and GPU specs (YAML data), installed as `kvplan.model_specs`."""
