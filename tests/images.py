"""Images for tests: small PNGs as bytes, base64 and data URLs, and malformed ones."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A deterministic RGB PNG with some structure (a gradient shifted by ``seed``)."""
    im = Image.new("RGB", (width, height))
    im.putdata(
        [
            ((x * 7 + seed * 31) % 256, (y * 5 + seed * 17) % 256, (x * y + seed) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def declared_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` but holds almost no data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    head = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    idat = b"IDAT" + zlib.compress(b"\x00" * 16)
    return head + struct.pack(">I", len(idat) - 4) + idat + struct.pack(">I", zlib.crc32(idat))


def malformed_urls() -> dict[str, str]:
    """Twelve image URLs that must each be refused with a 400."""
    good = png_bytes(40, 40)
    bmp = io.BytesIO()
    Image.new("RGB", (8, 8)).save(bmp, "BMP")
    tiff = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiff, "TIFF")
    return {
        "truncated png": data_url(good[: len(good) // 2]),
        "zero size": data_url(declared_png(0, 0)),
        "50000 x 50000 declared": data_url(declared_png(50_000, 50_000)),
        "bad base64": "data:image/png;base64,@@not*base64@@",
        "bmp (unsupported format)": data_url(bmp.getvalue(), "image/bmp"),
        "tiff (unsupported format)": data_url(tiff.getvalue(), "image/tiff"),
        "http url with fetching off": "http://127.0.0.1:9/cat.png",
        "https url with fetching off": "https://example.com/cat.png",
        "empty data": "data:image/png;base64,",
        "not an image": data_url(b"hello, this is text, not pixels" * 4),
        "not a data url": "ftp://example.com/cat.png",
        "data url without base64": "data:image/png,rawbytes",
    }
