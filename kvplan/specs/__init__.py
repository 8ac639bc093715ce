"""Spec models (pydantic) and their loaders."""
