import torch

from dsi.eplb.arena import SharedArena, layout_of


def test_attached_views_share_memory_and_survive_the_unlink():
    layout = layout_of({"pages": torch.zeros(3, 5), "slots": torch.zeros(7, dtype=torch.int64)})
    made = SharedArena.create(layout)
    seen = SharedArena.attach(made.name, layout)
    made.unlink()
    assert not made.path.exists()
    made.tensors["pages"][1, 2] = 5.0
    seen.tensors["slots"][3] = 9
    assert seen.tensors["pages"][1, 2] == 5.0 and made.tensors["slots"].tolist() == [0, 0, 0, 9, 0, 0, 0]
    assert seen.tensors["pages"].shape == (3, 5) and seen.tensors["slots"].dtype == torch.int64
