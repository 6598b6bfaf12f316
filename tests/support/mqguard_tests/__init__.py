"""Helpers shared by mqguard's own test modules.

On ``sys.path`` through pytest's ``pythonpath`` setting (pyproject.toml): the tests
run with ``--import-mode=importlib`` and without the repository root on ``sys.path``,
so test modules do not import each other. Not part of the distribution.
"""
