"""PrefillActor: one prefill instance. No engine yet: it serves no prompts, so it reports zero
load and answers only the calls every role answers (Ping, Load)."""

from __future__ import annotations

from dsi.config import EngineOptions
from dsi.roles.role import RoleActor


class PrefillActor(RoleActor):
    def __init__(self, name: str, options: EngineOptions) -> None:
        super().__init__(name)
        self.options = options
