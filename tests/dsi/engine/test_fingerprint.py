"""The machine fingerprint: its fields on this machine, parsing, the digest, the wire."""

import platform
import re

import msgspec
import pytest
import torch

from dsi.engine.fingerprint import machine_fingerprint, parse_cpuinfo, torch_libraries
from dsi.kernels import native
from dsi.messages.control import Heartbeat
from dsi.messages.fingerprint import MachineFingerprint
from tests.fingerprints import fingerprint as shared_fingerprint

SAPPHIRE_RAPIDS = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 \
avx512_fp16 amx_tile amx_bf16 amx_int8 avx512ifma

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 \
avx512_fp16 amx_tile amx_bf16 amx_int8 avx512ifma
"""

GRAVITON3 = """\
processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma \
lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp \
svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def fingerprint(**changes) -> MachineFingerprint:
    """An AVX2 machine's fingerprint with ``changes`` applied."""
    avx2 = {"isa": ("avx2", "fma"), "cpu_capability": "AVX2", "cpu_model": "Intel(R) Xeon(R) Platinum 8480+"}
    return shared_fingerprint(**{**avx2, **changes})


def test_flags_and_model_come_from_the_cpuinfo_text():
    model, isa = parse_cpuinfo(SAPPHIRE_RAPIDS)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert isa == (
        "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
        "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    )  # fmt: skip
    assert parse_cpuinfo(GRAVITON3) == ("0xd40", ("asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve"))
    assert parse_cpuinfo("") == ("", ())


def test_a_feature_counts_only_when_every_cpu_has_it():
    one_without_amx = SAPPHIRE_RAPIDS.replace(
        " amx_tile amx_bf16 amx_int8 avx512ifma\n\nprocessor", "\n\nprocessor"
    )
    _, isa = parse_cpuinfo(one_without_amx)
    assert "avx512_fp16" in isa and not any(flag.startswith("amx") for flag in isa)


def test_library_versions_are_read_from_torchs_config():
    config = (
        "  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64 "
        "architecture applications\n  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd69a3)\n"
    )
    assert torch_libraries(config) == ("2024.2-Product Build 20240605", "3.12.0")
    assert torch_libraries("  - GCC 13.3\n") == ("", "")


def test_this_machine():
    fp = machine_fingerprint()
    assert fp.arch == platform.machine()
    assert fp.torch == str(torch.__version__)
    assert fp.threads == torch.get_num_threads()
    assert fp.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert set(fp.native) == set(native.names()) >= {"paged_attention", "row_ops"}
    assert fp.native == {name: native.library(name) is not None for name in native.names()}
    if torch.backends.mkl.is_available():
        assert re.match(r"\d{4}\.\d", fp.mkl), fp.mkl
    if torch.backends.mkldnn.is_available():
        assert re.match(r"\d+\.\d+", fp.onednn), fp.onednn
    assert re.fullmatch(r"[0-9a-f]{12}", fp.digest)
    assert MachineFingerprint.of(**fp.deciding(), cpu_model=fp.cpu_model) == fp
    assert machine_fingerprint() is fp  # collected once


@pytest.mark.parametrize(
    "change",
    [
        {"isa": ("avx2",)},
        {"arch": "aarch64"},
        {"cpu_capability": "AVX512"},
        {"torch": "2.12.0+cpu"},
        {"mkl": ""},
        {"onednn": "3.12.0 (disabled)"},
        {"threads": 16},
        {"native": {"paged_attention": False, "row_ops": True}},
        {"env": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}},
    ],
)
def test_a_deciding_field_changes_the_digest(change):
    base, changed = fingerprint(), fingerprint(**change)
    assert changed.digest != base.digest
    assert base.differences(changed) == list(change)


def test_the_model_name_does_not_change_the_digest():
    assert fingerprint(cpu_model="AMD EPYC 9654").digest == fingerprint().digest
    assert fingerprint(cpu_model="").differences(fingerprint()) == []


def test_the_isa_summary_groups_avx512_and_amx():
    _, isa = parse_cpuinfo(SAPPHIRE_RAPIDS)
    fp = fingerprint(isa=isa)
    assert fp.isa_summary() == "avx avx2 fma f16c avx512{f,dq,bw,vl,vnni,bf16,fp16} amx{tile,bf16,int8}"
    assert fp.short() == f"{fp.digest[:8]} {fp.isa_summary()}"
    assert fingerprint(isa=()).isa_summary() == "-"


class OldHeartbeat(msgspec.Struct, tag="Heartbeat", array_like=True, omit_defaults=True, frozen=True):
    """The Heartbeat of a version without the fingerprint field."""

    instance_id: str
    role: str
    host: str
    pid: int
    address: str
    state: str = "ready"


def test_a_heartbeat_carries_it_and_stays_compatible_both_ways():
    fp = machine_fingerprint()
    beat = Heartbeat("decode-0", "decode", "h", 7, "tcp://h:7120", fingerprint=fp)
    wire = msgspec.msgpack.encode(beat)
    assert msgspec.msgpack.decode(wire, type=Heartbeat).fingerprint == fp
    assert msgspec.msgpack.decode(wire, type=OldHeartbeat).instance_id == "decode-0"  # older controller
    old = msgspec.msgpack.encode(OldHeartbeat("decode-0", "decode", "h", 7, "tcp://h:7120"))
    assert msgspec.msgpack.decode(old, type=Heartbeat).fingerprint is None  # older instance
