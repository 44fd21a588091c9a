"""dsi.transport: see ARCHITECTURE.md (repository layout)."""

from dsi.folders import step_aside

step_aside(__name__, __file__)  # imported as a bare name from the repository root
