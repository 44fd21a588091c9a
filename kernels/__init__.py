"""Kernels beside their torch references: ``paged_attention`` (C, built by ``native`` on first use)."""

from dsi.folders import step_aside

step_aside(__name__, __file__)  # imported as a bare name from the repository root
