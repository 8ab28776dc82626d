"""PD proxy bench: our proxy against a minimal FastAPI proxy over the same toy engines."""
