"""Command-line entry points: ``dsi`` (operators) and ``dsi-role`` (one host's roles)."""
