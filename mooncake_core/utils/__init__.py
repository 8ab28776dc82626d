"""Shared helpers: size strings, structured logging, networking."""
