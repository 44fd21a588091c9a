"""KvLayout: the layout file, block counts and sizes, and the fingerprint it adds to the machine's."""

import pytest

from dsi.messages.fingerprint import MachineFingerprint
from dsi.vllm.layout import LAYOUT_FILE, KvLayout
from tests.fingerprints import fingerprint

# 30 layers of [num_blocks, 3 kv heads, 128 tokens, 2 * 64] float32 (SmolLM2-135M on vLLM's CPU build)
LAYOUT = KvLayout(
    layers=30, block_shape=(3, 128, 128), dtype="torch.float32", layer_block_bytes=3 * 128 * 128 * 4,
    block_size=128, num_blocks=2000,
)  # fmt: skip


def test_the_layout_file_round_trips(tmp_path):
    LAYOUT.write(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [LAYOUT_FILE]  # the temporary file is gone
    assert KvLayout.read(tmp_path) == LAYOUT
    assert isinstance(KvLayout.read(tmp_path).block_shape, tuple)


def test_no_layout_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        KvLayout.read(tmp_path)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (128, 1), (129, 2), (256, 2)])
def test_blocks_round_up_to_whole_blocks(tokens, blocks):
    assert LAYOUT.blocks(tokens) == blocks


def test_a_block_is_every_layers_bytes():
    assert LAYOUT.block_bytes == 30 * 196_608  # 30 layers x 192 KiB
    assert LAYOUT.describe() == (
        "2000 KV blocks of 128 tokens, 30 layers x [3, 128, 128] torch.float32 (5.62 MiB a block)"
    )


def test_the_engine_tag_names_all_that_decides_the_bytes():
    tag = LAYOUT.engine_tag("0.11.0", "SmolLM2-135M-Instruct", "float32")
    assert tag == (
        "vllm 0.11.0 model=SmolLM2-135M-Instruct dtype=float32 kv=torch.float32[3x128x128] block=128"
    )


def test_the_fingerprint_covers_the_engine():
    machine = fingerprint()
    f32 = LAYOUT.fingerprint(machine, "0.11.0", "smol", "float32")
    bf16 = LAYOUT.fingerprint(machine, "0.11.0", "smol", "bfloat16")
    assert isinstance(f32, MachineFingerprint)
    assert f32.engine == LAYOUT.engine_tag("0.11.0", "smol", "float32")
    assert len({machine.digest, f32.digest, bf16.digest}) == 3
    assert machine.differences(f32) == ["engine"]
    assert f32 == LAYOUT.fingerprint(machine, "0.11.0", "smol", "float32")  # the same inputs, the same digest
