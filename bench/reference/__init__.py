"""Drivers of the original Mooncake (run under its venv; also run against ours through mooncake_core.compat)."""
