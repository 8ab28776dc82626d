"""Benchmarks, by role: one folder per component, ``reference/`` (drivers of the original Mooncake,
run under its venv), ``diagnostics/`` (traces that explain a number). Run from the repository root as
``python3 -m bench.<role>.<bench>``; results and commands are in BENCHMARKS.md."""
