"""Chaos, soak and fuzzing runs (long; findings rather than speed)."""
