"""Spec records (models.py), their loaders (registry.py) and their validation (schema.py, pydantic, lazily)."""
