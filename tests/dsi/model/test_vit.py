"""The tiny ViT: shapes, seeded weights saved and loaded, batch-invariant embeddings."""

from __future__ import annotations

import torch

from dsi.model.vit import TINY_VISION, encode_images, init_vision_weights, load_vision, save_vision


def test_an_image_gives_one_embedding_per_2x2_patches_the_same_in_any_batch(tmp_path):
    w = init_vision_weights(TINY_VISION)
    gen = torch.Generator().manual_seed(0)
    ims = [
        torch.rand(3, 56, 84, generator=gen),
        torch.rand(3, 28, 28, generator=gen),
        torch.rand(3, 112, 56, generator=gen),
    ]
    batch = encode_images(TINY_VISION, w, ims)
    assert [tuple(e.shape) for e in batch] == [(6, 256), (1, 256), (8, 256)]
    for im, e in zip(ims, batch, strict=True):
        assert torch.equal(encode_images(TINY_VISION, w, [im])[0], e)
    save_vision(tmp_path, TINY_VISION, w)
    cfg, loaded = load_vision(tmp_path)
    assert cfg == TINY_VISION and all(torch.equal(loaded[k], w[k]) for k in w)
    assert torch.equal(init_vision_weights(TINY_VISION)["proj2"], w["proj2"])  # seeded
