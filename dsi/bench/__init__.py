"""Benchmarks: scripts that print figures measured side by side with a baseline in one run."""
