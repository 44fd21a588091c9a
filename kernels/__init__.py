"""Kernels beside their torch references: ``paged_attention`` (C, built by ``native`` on first use)."""
