"""EncoderActor: one vision-encoder instance. No model yet: it encodes nothing, so it reports
zero load and answers only the calls every role answers (Ping, Load)."""

from __future__ import annotations

from dsi.roles.role import RoleActor


class EncoderActor(RoleActor):
    pass
