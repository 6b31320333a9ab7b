"""Images in the eval stage (issue 20, playbook §10): their size read from the header of untrusted
files, the chat content that carries them as base64 data URLs with the long side capped at 1120 px,
and the real eval stage asking a loopback server that answers like llama-server's
/v1/chat/completions, each image item's record in items.jsonl and each bad image an item error."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from samai.remote.box.stages.images import (
    IMAGE_CAP,
    MAX_IMAGE_BYTES,
    MAX_JPEG_SEGMENTS,
    ImageError,
    chat_content,
    image_size,
)
from tests.box_tools import stage_argv, stage_env
from tests.chatserver import ChatServer, serving

CPYTHON = Path(__file__).parent / "data" / "images" / "cpython"


def encoded(size: tuple[int, int], fmt: str, mode: str = "RGB", **options: object) -> bytes:
    """An image Pillow writes: a gradient, so that a resize has something to average."""
    image = Image.linear_gradient("L").resize(size).convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def decoded(url: str) -> tuple[str, bytes]:
    """(mime type, bytes) of a base64 data URL."""
    head, _, payload = url.partition(",")
    assert head.startswith("data:image/") and head.endswith(";base64"), head
    return head[len("data:"):-len(";base64")], base64.b64decode(payload, validate=True)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


# --- image_size: real files ------------------------------------------------------------------

WRITERS = [
    ("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("JPEG", {"quality": 20, "subsampling": 0}),
    ("GIF", {}), ("WEBP", {}), ("WEBP", {"lossless": True}), ("BMP", {}),
]
MODES = ["RGB", "RGBA", "L", "P", "1"]
SIZES = [(1, 1), (1600, 1200), (3000, 500), (7, 1600), (16383, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("fmt,options", WRITERS, ids=[f"{f}-{'-'.join(o) or 'plain'}" for f, o in WRITERS])
def test_the_size_of_every_format_pillow_writes_in_every_mode(fmt: str, options: dict) -> None:
    checked = 0
    for mode in MODES:
        for size in SIZES:
            try:
                data = encoded(size, fmt, mode, **options)
            except (OSError, ValueError):  # a mode this format cannot store (JPEG has no alpha)
                continue
            assert image_size(data) == size, (fmt, options, mode, size)
            assert Image.open(io.BytesIO(data)).size == size
            checked += 1
    assert checked >= len(SIZES) * 2


def test_the_size_of_images_written_by_other_encoders() -> None:
    """CPython's test images (tests/data/images/README.md); TIFF is not a format the stage sends."""
    for name in ("python.png", "python.gif", "python.jpg", "python-raw.jpg", "python.bmp", "python.webp"):
        assert image_size((CPYTHON / name).read_bytes()) == (16, 16), name
    assert image_size((CPYTHON / "python.tiff").read_bytes()) is None


def test_a_jpeg_whose_size_comes_after_exif_a_profile_comments_and_fill_bytes() -> None:
    exif = Image.Exif()
    exif[0x0110] = "camera " * 2000  # a 14 kB APP1 segment
    data = encoded((640, 480), "JPEG", exif=exif.tobytes(), icc_profile=b"\0" * 5000, comment=b"hello")
    assert image_size(data) == (640, 480)
    sof = data.index(b"\xff\xc0")
    padded = data[:sof] + b"\xff" * 7 + data[sof:]
    assert image_size(padded) == (640, 480)
    assert Image.open(io.BytesIO(padded)).size == (640, 480)


def test_bmp_headers_pillow_reads_but_does_not_write() -> None:
    v3 = bytearray(encoded((5, 3), "BMP"))
    v3[22:26] = struct.pack("<i", -3)  # rows stored top-down
    assert image_size(bytes(v3)) == (5, 3) == Image.open(io.BytesIO(bytes(v3))).size
    rows = (b"\x00\x00\xff" * 5 + b"\x00") * 3  # BITMAPCOREHEADER: 16-bit sizes
    core = b"BM" + struct.pack("<IHHI", 26 + len(rows), 0, 0, 26) + struct.pack("<IHHHH", 12, 5, 3, 1, 24) + rows
    assert image_size(core) == (5, 3) == Image.open(io.BytesIO(core)).size


def test_a_zero_size_is_no_size() -> None:
    png = bytearray(encoded((4, 4), "PNG"))
    png[16:24] = struct.pack(">II", 0, 4)
    gif = bytearray(encoded((4, 4), "GIF"))
    gif[8:10] = b"\0\0"
    assert image_size(bytes(png)) is None and image_size(bytes(gif)) is None


def test_a_jpeg_of_a_million_markers_is_given_up_in_bounded_work() -> None:
    real = encoded((33, 22), "JPEG")
    comments = lambda n: b"\xff\xd8" + b"\xff\xfe\x00\x02" * n + real[2:]  # noqa: E731 (n empty COM segments)
    assert image_size(comments(100)) == (33, 22)
    assert image_size(comments(1_000_000)) is None  # the size is there, past the walk's limit
    assert image_size(b"\xff\xd8" + b"\xff" * (MAX_JPEG_SEGMENTS + 10) + real[2:]) is None


# --- image_size: untrusted bytes ------------------------------------------------------------

SIGNATURES = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8", b"GIF89a", b"GIF87a", b"RIFF\0\0\0\0WEBPVP8 ",
              b"RIFF\0\0\0\0WEBPVP8L", b"RIFF\0\0\0\0WEBPVP8X", b"BM", b""]
REAL = [encoded((1600, 1200), "JPEG"), encoded((300, 50), "PNG"), encoded((9, 8), "GIF"), encoded((9, 8), "BMP"),
        encoded((90, 80), "WEBP"), encoded((90, 80), "WEBP", lossless=True), encoded((90, 80), "WEBP", "RGBA"),
        *(p.read_bytes() for p in sorted(CPYTHON.iterdir()))]


def assert_a_size_or_none(data: bytes) -> None:
    size = image_size(data)
    assert size is None or (len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size))


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SIGNATURES), st.binary(max_size=300))
def test_random_bytes_behind_each_signature_never_raise(signature: bytes, rest: bytes) -> None:
    assert_a_size_or_none(signature + rest)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REAL), st.data())
def test_a_truncated_real_file_has_its_size_or_none(real: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(real)))
    size = image_size(real[:cut])
    assert size is None or size == image_size(real)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(REAL), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8))
def test_a_mutated_real_file_never_raises(real: bytes, flips: list[tuple[int, int]]) -> None:
    mutated = bytearray(real)
    for at, value in flips:
        mutated[at % len(mutated)] = value
    assert_a_size_or_none(bytes(mutated))


# --- chat_content ---------------------------------------------------------------------------


def test_an_image_within_the_cap_is_sent_byte_for_byte_before_the_text(tmp_path: Path) -> None:
    path = tmp_path / "small.png"
    path.write_bytes(encoded((40, 30), "PNG"))
    content, record = chat_content(str(path), "What colour?")
    assert [part["type"] for part in content] == ["image_url", "text"] and content[1]["text"] == "What colour?"
    assert decoded(content[0]["image_url"]["url"]) == ("image/png", path.read_bytes())
    assert record == {"path": str(path), "width": 40, "height": 30, "sent_width": 40, "sent_height": 30,
                      "sent_bytes": path.stat().st_size, "resized": False}


@pytest.mark.parametrize("size,fmt,sent,mime", [
    ((1600, 1200), "JPEG", (1120, 840), "image/jpeg"),
    ((3000, 500), "PNG", (1120, 187), "image/png"),
    ((500, 3000), "GIF", (187, 1120), "image/jpeg"),
    ((1121, 1121), "BMP", (1120, 1120), "image/jpeg"),
])
def test_an_image_over_the_cap_is_resized_to_the_cap(tmp_path: Path, size, fmt, sent, mime) -> None:
    path = tmp_path / "big"
    path.write_bytes(encoded(size, fmt))
    content, record = chat_content(str(path), "q")
    kind, data = decoded(content[0]["image_url"]["url"])
    assert kind == mime
    assert Image.open(io.BytesIO(data)).size == sent == (record["sent_width"], record["sent_height"])
    assert record["resized"] and (record["width"], record["height"]) == size and record["sent_bytes"] == len(data)


def test_the_cap_is_a_parameter_and_a_palette_keeps_its_transparency(tmp_path: Path) -> None:
    image = Image.new("P", (300, 100))
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    image.paste(1, (150, 0, 300, 100))
    path = tmp_path / "two.png"
    image.save(path, transparency=0)
    content, record = chat_content(str(path), "q", cap=60)
    sent = Image.open(io.BytesIO(decoded(content[0]["image_url"]["url"])[1]))
    assert sent.size == (60, 20) and sent.mode == "RGBA"
    assert sent.getpixel((5, 10))[3] == 0 and sent.getpixel((55, 10)) == (0, 0, 255, 255)
    assert record["sent_width"] == 60 and record["resized"]


def test_a_webp_is_sent_as_png_since_the_server_cannot_decode_webp(tmp_path: Path) -> None:
    path = tmp_path / "small.webp"
    path.write_bytes(encoded((90, 60), "WEBP", lossless=True))
    content, record = chat_content(str(path), "q")
    kind, data = decoded(content[0]["image_url"]["url"])
    assert kind == "image/png"
    assert Image.open(io.BytesIO(data)).tobytes() == Image.open(path).convert("RGB").tobytes()
    assert record["resized"] is False and record["sent_bytes"] == len(data)


def test_what_cannot_be_sent_is_an_image_error(tmp_path: Path) -> None:
    cases = {}
    cases["garbage"] = tmp_path / "garbage.png"
    cases["garbage"].write_bytes(b"not an image at all")
    cases["missing"] = tmp_path / "missing.png"
    cases["folder"] = tmp_path / "folder.png"
    cases["folder"].mkdir()
    cases["fifo"] = tmp_path / "fifo.png"  # opening it for reading would wait for a writer forever
    os.mkfifo(cases["fifo"])
    cases["huge"] = tmp_path / "huge.png"
    with cases["huge"].open("wb") as f:
        f.write(encoded((4, 4), "PNG"))
        f.truncate(MAX_IMAGE_BYTES + 1)
    cases["cut"] = tmp_path / "cut.png"  # a good header over the cap, the pixels cut short
    cases["cut"].write_bytes(encoded((3000, 500), "PNG")[:2000])
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    cases["bomb"] = tmp_path / "bomb.png"
    cases["bomb"].write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b""))
    said = {}
    for name, path in cases.items():
        with pytest.raises(ImageError) as error:
            chat_content(str(path), "q")
        said[name] = str(error.value)
    assert "not a PNG, JPEG, GIF, WebP or BMP" in said["garbage"]
    assert "No such file" in said["missing"] and "not a regular file" in said["folder"]
    assert "not a regular file" in said["fifo"] and "over the 32 MiB limit" in said["huge"]
    assert "cannot decode" in said["cut"] and "too many pixels" in said["bomb"]


# --- the eval stage against a loopback llama-server -------------------------------------------


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with serving() as server:
        yield server


@pytest.fixture
def eval_set(tmp_path: Path) -> Path:
    """An eval set of images, good and bad, in its own folder: the data file's path."""
    folder = tmp_path / "evalset"
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "small.png").write_bytes(encoded((40, 30), "PNG"))
    (folder / "images" / "photo.jpg").write_bytes(encoded((1600, 1200), "JPEG"))
    (folder / "images" / "wide.png").write_bytes(encoded((3000, 500), "PNG"))
    (folder / "images" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    (tmp_path / "outside.png").write_bytes(encoded((10, 10), "PNG"))
    (folder / "images" / "link.png").symlink_to(tmp_path / "outside.png")
    (folder / "images" / "inner.png").symlink_to("small.png")
    items = [("small", "images/small.png"), ("photo", "images/photo.jpg"), ("wide", "images/wide.png"),
             ("inner", "images/inner.png"), ("text", None), ("escape", "../outside.png"),
             ("absolute", str(tmp_path / "outside.png")), ("link", "images/link.png"),
             ("missing", "images/missing.png"), ("corrupt", "images/corrupt.png")]
    data = folder / "eval.jsonl"
    data.write_text("".join(json.dumps({"id": name, "prompt": "What colour is the shape?", "gold": "red",
                                        **({"image": image} if image else {})}) + "\n" for name, image in items))
    return data


def run_eval(server: ChatServer, data: Path, out: Path, *args: object, python: str = sys.executable,
             flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = stage_argv("stages.eval", "--url", server.url, "--data", data, "--out", out, "--max-tokens", 8,
                      "--timeout", 30, "--extract", "first-word", *args, python=python)
    done = subprocess.run(argv[:1] + list(flags) + argv[1:], env=stage_env(), capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def sent_images(server: ChatServer) -> dict[str, tuple[str, bytes]]:
    """The image each request carried, by its question's item (the image is the first part)."""
    images = {}
    for body in server.bodies:
        (message,) = body["messages"]
        if isinstance(message["content"], list):
            image, text = message["content"]
            assert text == {"type": "text", "text": "What colour is the shape?"}
            images[len(images)] = decoded(image["image_url"]["url"])
    return images


@pytest.mark.slow
def test_the_eval_stage_sends_images_capped_and_records_them(chat_server: ChatServer, eval_set: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "runs" / "eval" / "images"
    done = run_eval(chat_server, eval_set, out)
    assert done.returncode == 2 and "EVAL_RC=2" in done.stdout, done.stdout + done.stderr
    rows = {row["id"]: row for row in map(json.loads, (out / "items.jsonl").read_text().splitlines())}
    assert list(rows) == ["small", "photo", "wide", "inner", "text"] and all(r["correct"] for r in rows.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 5 and summary["errors"] == 5 and summary["accuracy"] == 1

    folder = eval_set.parent / "images"
    assert rows["small"]["image"] == {"path": "images/small.png", "width": 40, "height": 30, "sent_width": 40,
                                      "sent_height": 30, "sent_bytes": (folder / "small.png").stat().st_size,
                                      "resized": False}
    assert rows["photo"]["image"] | {"sent_bytes": 0} == {
        "path": "images/photo.jpg", "width": 1600, "height": 1200, "sent_width": 1120, "sent_height": 840,
        "sent_bytes": 0, "resized": True}
    assert (rows["wide"]["image"]["sent_width"], rows["wide"]["image"]["sent_height"]) == (1120, 187)
    assert rows["inner"]["image"]["path"] == "images/inner.png" and "image" not in rows["text"]

    sent = sent_images(chat_server)
    assert len(chat_server.bodies) == 5 and len(sent) == 4
    assert sent[0] == ("image/png", (folder / "small.png").read_bytes())  # byte for byte
    assert sent[3] == sent[0]
    for index, mime, size in ((1, "image/jpeg", (1120, 840)), (2, "image/png", (1120, 187))):
        assert sent[index][0] == mime and Image.open(io.BytesIO(sent[index][1])).size == size
        assert len(sent[index][1]) == rows[["photo", "wide"][index - 1]]["image"]["sent_bytes"]
    assert chat_server.bodies[4]["messages"][0]["content"] == "What colour is the shape?"  # text as before

    log = done.stdout
    assert "item escape: image '../outside.png' leaves the data's folder" in log
    assert f"item absolute: image {str(tmp_path / 'outside.png')!r}: not a relative path" in log
    assert "item link: image 'images/link.png' leaves the data's folder" in log
    assert "item missing: cannot read image" in log and "No such file" in log
    assert "item corrupt: " in log and "is not a PNG, JPEG, GIF, WebP or BMP image" in log


@pytest.mark.slow
def test_the_cap_is_an_option(chat_server: ChatServer, eval_set: Path, tmp_path: Path) -> None:
    out = tmp_path / "capped"
    run_eval(chat_server, eval_set, out, "--image-cap", 100)
    rows = {row["id"]: row for row in map(json.loads, (out / "items.jsonl").read_text().splitlines())}
    assert {name: (r["image"]["sent_width"], r["image"]["sent_height"]) for name, r in rows.items() if "image" in r} \
        == {"small": (40, 30), "photo": (100, 75), "wide": (100, 17), "inner": (40, 30)}
    refused = run_eval(chat_server, eval_set, tmp_path / "zero", "--image-cap", 0)
    assert refused.returncode == 2 and "--image-cap: at least 1 px" in refused.stderr


@pytest.mark.slow
def test_an_image_item_with_the_text_format_is_an_item_error(chat_server: ChatServer, eval_set: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "text"
    done = run_eval(chat_server, eval_set, out, "--prompt-format", "text")
    assert "item small: image 'images/small.png': an image item needs --prompt-format chat" in done.stdout
    rows = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["text"] and len(chat_server.bodies) == 1
    assert json.loads((out / "summary.json").read_text())["errors"] == 9


@pytest.mark.slow
def test_without_pillow_only_the_images_that_need_resizing_are_errors(chat_server: ChatServer, eval_set: Path,
                                                                      tmp_path: Path) -> None:
    """The stage run by a Python that has no Pillow (-S: no site-packages), as the system Python on a box."""
    out = tmp_path / "bare"
    done = run_eval(chat_server, eval_set, out, flags=("-S",))
    rows = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["small", "inner", "text"]
    log = done.stdout
    assert "item photo: image " in log and "(1600x1200, over the 1120 px cap), which needs Pillow" in log
    assert "item wide: image " in log and "(3000x500, over the 1120 px cap), which needs Pillow" in log
    assert sent_images(chat_server)[0] == ("image/png", (eval_set.parent / "images" / "small.png").read_bytes())
    assert IMAGE_CAP == 1120
