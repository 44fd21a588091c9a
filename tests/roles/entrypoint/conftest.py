"""A live gateway: controller + decode + entrypoint in one ``dsi-role`` process on 127.0.0.1."""

import pytest

from tests.roles.entrypoint.live_gateway import live_gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with live_gateway(
        tmp_path_factory.mktemp("gateway"), ("controller-0", "entrypoint-0", "prefill-0", "decode-0")
    ) as base:
        yield base
