"""MachineFingerprint.engine: what beside the machine decides the KV bytes of a non-dsi engine."""

import msgspec

from dsi.messages.fingerprint import MachineFingerprint
from tests.fingerprints import FIELDS, fingerprint

# tests.fingerprints.FIELDS as digested by the version before the engine field (a01e530^)
DIGEST_BEFORE_ENGINE = "b24f645ff755"
TAG = "vllm 0.11.0 model=smol dtype=float32 kv=torch.float32[3x128x128] block=128"


class FingerprintBeforeEngine(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """MachineFingerprint of a version without the engine field."""

    digest: str
    arch: str
    isa: tuple[str, ...]
    cpu_capability: str
    torch: str
    mkl: str
    onednn: str
    threads: int
    native: dict[str, bool]
    env: dict[str, str]
    cpu_model: str = ""


def test_without_an_engine_the_digest_is_the_one_before_the_field():
    fp = fingerprint()
    assert fp.engine == ""
    assert "engine" not in fp.deciding()
    assert fp.digest == DIGEST_BEFORE_ENGINE
    assert fp.with_engine("") == fp


def test_with_engine_changes_the_digest_and_only_the_engine():
    fp = fingerprint()
    tagged = fp.with_engine(TAG)
    assert tagged.engine == TAG and tagged.deciding()["engine"] == TAG
    assert tagged.digest != fp.digest
    assert tagged.digest != fp.with_engine(TAG.replace("float32", "bfloat16")).digest
    assert fp.differences(tagged) == ["engine"]
    assert tagged == MachineFingerprint.of(**FIELDS, engine=TAG)


def test_the_engine_travels_and_stays_compatible_both_ways():
    tagged = fingerprint().with_engine(TAG)
    wire = msgspec.msgpack.encode(tagged)
    assert msgspec.msgpack.decode(wire, type=MachineFingerprint) == tagged
    assert msgspec.msgpack.decode(wire, type=FingerprintBeforeEngine).digest == tagged.digest  # older peer
    old = msgspec.msgpack.encode(FingerprintBeforeEngine(digest=DIGEST_BEFORE_ENGINE, **FIELDS))
    assert msgspec.msgpack.decode(old, type=MachineFingerprint) == fingerprint()  # older instance
