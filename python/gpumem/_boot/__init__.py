"""Holds the sitecustomize.py that `gpumem run` puts first on PYTHONPATH."""
