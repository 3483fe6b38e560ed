"""Image files as bytes: what format and size they are, their content hash, and a PNG writer.

``sniff`` reads the header of a PNG, JPEG, GIF or WebP file (the formats OpenAI accepts) and returns its
format and pixel size, or raises ``BadImage`` saying what is wrong. A PNG is checked whole (chunk CRCs
and that its image data inflates), the others by header; an engine decodes them fully later, and a file
that fails there is that worker's error. ``write_png`` makes an RGB PNG with the standard library only.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

from dynamo_api.errors import DynamoError

__all__ = ["MAX_PIXELS", "BadImage", "ImageInfo", "content_hash", "sniff", "write_png"]

MAX_PIXELS = 64 * 1024 * 1024  # 8192 x 8192: larger images are refused, not decoded
_PNG_SIG = b"\x89PNG\r\n\x1a\n"


class BadImage(DynamoError, ValueError):
    """The bytes are not an image this server can use; the message says why."""


@dataclass(frozen=True)
class ImageInfo:
    format: str  # png | jpeg | gif | webp
    width: int
    height: int


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sniff(data: bytes) -> ImageInfo:
    if data.startswith(_PNG_SIG):
        info = _png(data)
    elif data.startswith(b"\xff\xd8\xff"):
        info = _jpeg(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 10:
            raise BadImage("the GIF file is truncated")
        w, h = struct.unpack("<HH", data[6:10])
        info = ImageInfo("gif", w, h)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        info = _webp(data)
    else:
        raise BadImage("the data is not a PNG, JPEG, GIF or WebP image")
    if info.width < 1 or info.height < 1:
        raise BadImage(f"the {info.format} image has no pixels ({info.width}x{info.height})")
    if info.width * info.height > MAX_PIXELS:
        raise BadImage(
            f"the {info.format} image is {info.width}x{info.height}, more than {MAX_PIXELS} pixels; "
            "send a smaller one"
        )
    return info


def _png(data: bytes) -> ImageInfo:
    pos, size, idat = 8, None, []
    while True:
        if pos + 8 > len(data):
            raise BadImage("the PNG file is truncated (no IEND chunk)")
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        crc = data[pos + 8 + length : pos + 12 + length]
        if len(body) != length or len(crc) != 4:
            raise BadImage("the PNG file is truncated")
        if zlib.crc32(kind + body) != struct.unpack(">I", crc)[0]:
            raise BadImage(f"the PNG file is corrupt (bad CRC in its {kind.decode('latin-1')} chunk)")
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if size is None or not idat:
        raise BadImage("the PNG file has no IHDR or no image data")
    try:
        inflater = zlib.decompressobj()
        inflater.decompress(b"".join(idat), MAX_PIXELS * 8)
    except zlib.error as e:
        raise BadImage(f"the PNG image data is corrupt ({e})") from None
    return ImageInfo("png", *size)


def _jpeg(data: bytes) -> ImageInfo:
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise BadImage("the JPEG file is corrupt (no marker where one belongs)")
        marker = data[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > len(data):
                break
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return ImageInfo("jpeg", w, h)
        pos += 2 + length
    raise BadImage("the JPEG file is truncated (no frame header)")


def _webp(data: bytes) -> ImageInfo:
    kind = data[12:16]
    if kind == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF)
    if kind == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return ImageInfo("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if kind == b"VP8X" and len(data) >= 30:
        return ImageInfo(
            "webp", int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
        )
    raise BadImage("the WebP file is truncated or of an unknown kind")


def write_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (``width * height * 3`` bytes, rows top to bottom)."""
    if len(rgb) != width * height * 3:
        raise ValueError("rgb must hold width * height * 3 bytes")
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return _PNG_SIG + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
