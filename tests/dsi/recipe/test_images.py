"""Image input: decode, bound, resize; every malformed image is a 400 naming the image."""

from __future__ import annotations

import pytest

from dsi.model.vit import TINY_VISION
from dsi.recipe.errors import RequestError
from dsi.recipe.images import ImageLimits, decode_image, fit
from tests.images import data_url, malformed_urls, png_bytes


def test_an_image_is_resized_to_whole_tiles_within_the_pixel_bound():
    im = decode_image(data_url(png_bytes(100, 60)), TINY_VISION, ImageLimits(), "image[0]")
    assert (im.height, im.width, im.tokens) == (56, 112, 8)
    assert len(im.pixels) == 56 * 112 * 3 and len(im.digest) == 16
    big = decode_image(data_url(png_bytes(1000, 500)), TINY_VISION, ImageLimits(), "image[0]")
    assert big.height * big.width <= TINY_VISION.max_pixels and big.height % 28 == big.width % 28 == 0
    assert fit(1, 10_000, TINY_VISION) == (28, 1792)  # a thin image keeps one tile of height


def test_the_digest_is_of_the_content():
    a = decode_image(data_url(png_bytes(64, 64, seed=1)), TINY_VISION, ImageLimits(), "x")
    b = decode_image(data_url(png_bytes(64, 64, seed=1)), TINY_VISION, ImageLimits(), "x")
    c = decode_image(data_url(png_bytes(64, 64, seed=2)), TINY_VISION, ImageLimits(), "x")
    assert a.digest == b.digest != c.digest


@pytest.mark.parametrize("name", sorted(malformed_urls()))
def test_malformed_images_are_400(name):
    with pytest.raises(RequestError) as err:
        decode_image(malformed_urls()[name], TINY_VISION, ImageLimits(), "image[0]")
    assert err.value.status == 400 and err.value.api_code == "invalid_image"
    assert err.value.param == "image[0]"


def test_too_many_bytes_is_400():
    with pytest.raises(RequestError, match="larger than"):
        decode_image(data_url(png_bytes(64, 64)), TINY_VISION, ImageLimits(max_bytes=100), "image[0]")
