"""A stand-in for Mooncake's package in tests (see engine.py)."""
