"""Traces and probes that explain a bench's number (not benches themselves)."""
