"""The draft's self-distillation: seeded, so the same settings give the same draft."""

import torch

from dsi.model.config import ModelConfig
from dsi.model.draft import DraftShape, load_draft, save_draft
from dsi.model.train_draft import TrainSettings, train
from dsi.model.weights import init_weights

MINI = ModelConfig(
    name="mini",
    vocab_size=1024,
    hidden=32,
    n_layers=2,
    n_producer=1,
    kv_sources=(0,),
    n_heads=2,
    head_dim=16,
    window=16,
    keep=22,
    block_size=16,
    n_experts=2,
    top_k=1,
    expert_dim=32,
    shared_dim=32,
    max_context=256,
)


def test_training_is_seeded_and_round_trips(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = init_weights(MINI)
        s = TrainSettings(prompts=4, prompt_len=(4, 8), tokens=12, vocab=64, ffn=32, steps=6, batch=16)
        a, report = train(MINI, w, s, log=lambda m: None)
        b, _ = train(MINI, w, s, log=lambda m: None)
    finally:
        torch.set_num_threads(before)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert report["steps"] == 6 and len(report["held_out_accept_pos"]) == 5
    save_draft(tmp_path, a)
    back = load_draft(tmp_path, MINI.hidden)
    assert DraftShape.of(back) == DraftShape(32, 2, 32, 64)
