"""Images for a vision-language model's questions: their size from the header, and the chat content
that carries one to llama-server as a base64 data URL (playbook §10).

Runs ON the box, imported by the eval stage. Standard library only at import time (Python >= 3.8):
Pillow is imported only when an image must be re-encoded, so a text eval never needs it.

The long side of a sent image is capped at IMAGE_CAP px, the playbook's visual-token budget: a
bigger image is resized (aspect kept, LANCZOS) and re-encoded, PNG for PNG input, else JPEG
quality 90. An image within the cap goes as it is, byte for byte, except WebP: llama-server
decodes images with stb_image, which cannot read WebP, so a WebP is always re-encoded (as PNG,
lossless, so its pixels are sent as they are).
Everything here reads untrusted files: image_size never raises and does bounded work, and
chat_content raises ImageError (one item's error, never a traceback) for what it cannot send.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import struct
import sys
from typing import Any, Dict, List, Optional, Tuple

IMAGE_CAP = 1120  # px, the long side: playbook §10's visual-token budget
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_PIXELS = 64 * 1024 * 1024  # what a resize may decode: 8192 x 8192, 256 MiB as RGBA
MAX_JPEG_SEGMENTS = 10000  # real files have tens; a hostile one may have millions

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # not DHT, JPG, DAC
JPEG_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn and TEM carry no length
MIME = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp", "bmp": "image/bmp"}


class ImageError(ValueError):
    """An image that cannot be sent as asked: its item is an error, the run goes on."""


def inside(folder: str, name: Any) -> str:
    """The path of an image a data file names: relative to the data's folder, and inside it once
    every symlink is resolved (data files are untrusted)."""
    if not isinstance(name, str) or not name or "\0" in name or os.path.isabs(name):
        raise ImageError("image %r: not a relative path" % (name,))
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise ImageError("image %r leaves the data's folder %s" % (name, root))
    return path


def image_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(width, height) from the header of a PNG, JPEG, GIF, WebP or BMP, else None."""
    found = sniff(data)
    return None if found is None else (found[1], found[2])


def sniff(data: bytes) -> Optional[Tuple[str, int, int]]:
    """(format, width, height) from the header, or None for anything unreadable."""
    if data[:8] == PNG_SIGNATURE:
        return _png(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _sized("gif", data, "<HH", 6)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data[:2] == b"BM":
        return _bmp(data)
    return None


def _sized(kind: str, data: bytes, fmt: str, offset: int) -> Optional[Tuple[str, int, int]]:
    """kind with the width and height unpacked from data at offset, both positive, else None."""
    if len(data) < offset + struct.calcsize(fmt):
        return None
    width, height = struct.unpack_from(fmt, data, offset)
    return _positive(kind, width, height)


def _positive(kind: str, width: int, height: int) -> Optional[Tuple[str, int, int]]:
    return (kind, width, height) if width > 0 and height > 0 else None


def _png(data: bytes) -> Optional[Tuple[str, int, int]]:
    if data[12:16] != b"IHDR":  # the first chunk, always
        return None
    return _sized("png", data, ">II", 16)


def _jpeg(data: bytes) -> Optional[Tuple[str, int, int]]:
    """Walk the segments to the first SOFn, which holds the size."""
    pos = 2
    for _ in range(MAX_JPEG_SEGMENTS):
        if pos + 4 > len(data) or data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte before the marker
            pos += 1
        elif marker in JPEG_STANDALONE:
            pos += 2
        elif marker in (0x00, 0xD8, 0xD9, 0xDA):  # no SOF before SOS or EOI: nothing to read
            return None
        elif marker in JPEG_SOF:
            found = _sized("jpeg", data, ">HH", pos + 5)  # length, precision, then height, width
            return None if found is None else ("jpeg", found[2], found[1])
        else:
            length = struct.unpack_from(">H", data, pos + 2)[0]
            if length < 2:
                return None
            pos += 2 + length
    return None


def _webp(data: bytes) -> Optional[Tuple[str, int, int]]:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a" and len(data) >= 30:  # a key frame
        width, height = struct.unpack_from("<HH", data, 26)
        return _positive("webp", width & 0x3FFF, height & 0x3FFF)  # the top 2 bits: upscaling
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = struct.unpack_from("<I", data, 21)[0]
        return "webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return "webp", int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def _bmp(data: bytes) -> Optional[Tuple[str, int, int]]:
    if len(data) < 18:
        return None
    header = struct.unpack_from("<I", data, 14)[0]
    if header == 12:  # BITMAPCOREHEADER: 16-bit sizes
        return _sized("bmp", data, "<HH", 18)
    if header < 16 or len(data) < 26:  # the others (16 to 124 bytes) start with 32-bit sizes
        return None
    width, height = struct.unpack_from("<ii", data, 18)
    return _positive("bmp", width, abs(height))  # a negative height: rows stored top-down


def chat_content(path: str, text: str, cap: int = IMAGE_CAP) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """(content, record): the OpenAI chat content that asks text about the image at path (the
    image first, as the tiny model is trained), and what was sent, for the eval's items.jsonl."""
    if cap < 1:
        raise ValueError("the image cap must be at least 1 px, not %r" % (cap,))
    data = read_image(path)
    found = sniff(data)
    if found is None:
        raise ImageError("%r is not a PNG, JPEG, GIF, WebP or BMP image that can be read" % (path,))
    kind, width, height = found
    size = capped(width, height, cap)
    if size != (width, height) and width * height > MAX_PIXELS:  # decoding it would take GiBs
        raise ImageError("image %r is %dx%d, too many pixels to resize (at most %d)"
                         % (path, width, height, MAX_PIXELS))
    if size != (width, height):
        kind, data, size = reencode(path, data, kind, size, "%dx%d, over the %d px cap" % (width, height, cap))
    elif kind == "webp":
        kind, data, size = reencode(path, data, kind, size, "WebP, which llama-server cannot decode")
    url = "data:%s;base64,%s" % (MIME[kind], base64.b64encode(data).decode("ascii"))
    content = [{"type": "image_url", "image_url": {"url": url}},
               {"type": "text", "text": text}]  # type: List[Dict[str, Any]]
    record = {"path": path, "width": width, "height": height, "sent_width": size[0], "sent_height": size[1],
              "sent_bytes": len(data), "resized": size != (width, height)}  # type: Dict[str, Any]
    return content, record


def read_image(path: str) -> bytes:
    """The file's bytes: a regular file of at most MAX_IMAGE_BYTES (a FIFO would block forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:
        raise ImageError("cannot read image %r: %s" % (path, getattr(e, "strerror", None) or e)) from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageError("image %r is not a regular file" % (path,))
        if info.st_size > MAX_IMAGE_BYTES:
            raise ImageError("image %r is %d bytes, over the %d MiB limit"
                             % (path, info.st_size, MAX_IMAGE_BYTES // 2**20))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as e:
        raise ImageError("cannot read image %r: %s" % (path, e.strerror or e)) from e
    finally:
        os.close(fd)
    if len(data) > MAX_IMAGE_BYTES:  # it grew since fstat
        raise ImageError("image %r is over the %d MiB limit" % (path, MAX_IMAGE_BYTES // 2**20))
    return data


def capped(width: int, height: int, cap: int) -> Tuple[int, int]:
    """The size with the long side at most cap, the aspect kept (each side at least 1 px)."""
    long_side = max(width, height)
    if long_side <= cap:
        return width, height
    scaled = lambda side: max(1, (side * cap + long_side // 2) // long_side)  # noqa: E731 (rounded)
    return scaled(width), scaled(height)


def reencode(path: str, data: bytes, kind: str, size: Tuple[int, int],
             why: str) -> Tuple[str, bytes, Tuple[int, int]]:
    """(kind, bytes, size) of the image decoded, resized to size and encoded again: PNG for PNG
    and WebP (lossless), else JPEG quality 90. why: for the message when Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise ImageError("image %r must be re-encoded (%s), which needs Pillow, not installed for %s"
                         % (path, why, sys.executable)) from None
    out_kind = "png" if kind in ("png", "webp") else "jpeg"
    try:
        with Image.open(io.BytesIO(data)) as image:
            image = pixels_for(image, out_kind)
            if image.size != size:
                image = image.resize(size, Image.Resampling.LANCZOS)
            out = io.BytesIO()
            if out_kind == "png":
                image.save(out, "PNG")
            else:
                image.save(out, "JPEG", quality=90)
    except Exception as e:  # a decoder fed untrusted bytes raises anything: the item's error, not the run's
        raise ImageError("cannot decode image %r: %s: %s" % (path, type(e).__name__, e)) from e
    return out_kind, out.getvalue(), size


def pixels_for(image: Any, out_kind: str) -> Any:
    """The image decoded in a mode LANCZOS resizes and out_kind stores (a palette resizes as nearest)."""
    if out_kind == "jpeg":
        return image if image.mode in ("L", "RGB") else image.convert("RGB")
    if image.mode in ("L", "LA", "RGB", "RGBA"):
        return image
    alpha = "A" in image.getbands() or "transparency" in image.info
    return image.convert("RGBA" if alpha else "RGB")
