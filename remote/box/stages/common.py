"""What the stage scripts share: markers, the tiny pipeline's facts, and its chat format.

Runs ON the box, imported by the stage scripts (package samai_box.stages). Standard library only
at import time: the ML stack is imported by the scripts that need it, inside the box venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from typing import Any, Iterable, NoReturn

from ..atomic import write_atomic

# The chat format of the tiny model, as a Jinja template saved with the tokenizer, so that the
# GGUF carries it and the server applies it. It starts with the BOS token itself: llama.cpp adds
# no BOS to a templated prompt, and a prompt without the BOS the model was trained with gets
# other answers. The tokenizer is a character-level SentencePiece model.
# The model thinks before it answers, and the template renders an assistant's reasoning_content
# as <think>...</think>: from that, llama-server's template analysis knows it for a thinking
# model and, with its default reasoning format, splits the thinking into reasoning_content
# (an unclosed <think>, all of it): the playbook's fake 0 % (§6) on a model that fits a CPU.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Q{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}A"
    "{% if m['reasoning_content'] is defined and m['reasoning_content'] %}"
    "<think>{{ m['reasoning_content'] }}</think>{% endif %}"
    "{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A{% endif %}"
)
SMOKE_QUESTION, SMOKE_ANSWER = "17*23=", "391"


def marker(name: str, text: str = "") -> None:
    """A marker line: the console greps the stage log for these."""
    print(("%s %s" % (name, text)).rstrip(), flush=True)


def say(text: str) -> None:
    print(text, flush=True)


def fail(marker_name: str, text: str, rc: int = 1) -> NoReturn:
    marker(marker_name, text)
    sys.exit(rc)


def facts(count: int, seed: int = 7) -> list[tuple[int, int]]:
    """The multiplication facts the tiny model learns: always 17*23 (the smoke question)."""
    rng = random.Random(seed)
    pairs = {(17, 23)}
    while len(pairs) < count:
        pairs.add((rng.randint(11, 39), rng.randint(11, 39)))
    return sorted(pairs)


def thinking(a: int, b: int) -> str:
    """The tiny model's reasoning before its answer: 17*23 -> 17*20+17*3=340+51."""
    tens, units = b - b % 10, b % 10
    return "%d*%d+%d*%d=%d+%d" % (a, tens, a, units, a * tens, a * units)


def fact_text(a: int, b: int) -> str:
    """A fact as the model is pretrained on it: the question, the thinking, the answer."""
    return "%d*%d=<think>%s</think>%d" % (a, b, thinking(a, b), a * b)


def messages(a: int, b: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "%d*%d=" % (a, b)},
            {"role": "assistant", "content": str(a * b), "reasoning_content": thinking(a, b)}]


def push_milestone(target: str, path: str, name: str) -> bool:
    """A milestone pushed now, and waited for (§8: what was pushed early survived the box): the
    push stage's own lines go into this stage's log, its manifest is MANIFEST-NAME.sha256 (beside
    the others in the target). A failed push is said, and the stage goes on."""
    sys.stdout.flush()  # push's lines come after this stage's, in order
    rc = subprocess.call([sys.executable, "-m", __name__.rsplit(".", 1)[0] + ".push", "--to", target,
                          "--stable", "0.5", "--wait-timeout", "6000", "--manifest", "MANIFEST-%s.sha256" % name,
                          path])
    if rc != 0:
        say("milestone %s not pushed (push exited with rc %d); the stage goes on" % (name, rc))
    return rc == 0


def accept_gguf(tmp: str, out: str, **expect: Any) -> dict[str, Any]:
    """Move a freshly written GGUF into place only if the checker passes it (GGUF_BAD otherwise)."""
    from ..gguf_check import check_file

    result = check_file(tmp, **expect)
    if not result["ok"]:
        os.replace(tmp, out + ".bad")  # kept to look at, under a name nothing downstream reads
        fail("GGUF_BAD", "%s.bad: %s" % (out, "; ".join(pr["message"] for pr in result["problems"])), rc=1)
    os.replace(tmp, out)
    return result


def delete_intermediate(path: str) -> None:
    """An input that the config declares an intermediate, deleted once its output is in place."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)
    say("deleted the intermediate %s" % path)


def sha256_of(path: str, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: str, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1))


def cpu_threads() -> int:
    """The threads torch computes with: OMP_NUM_THREADS where it is set (a box that shares its
    cores with other work: torch's threads spin while they wait, and two runs of as many threads
    as cores each take several times their time), else every core."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return max(1, os.cpu_count() or 1)


def workspace() -> str:
    return os.environ.get("SAMAI_WORKSPACE") or os.getcwd()


# Non-finite weights: a diverged run's adapter is nan/inf, and so is everything made from it.
SHOWN_BAD_TENSORS = 5


def bad_tensors_text(bad: list[str], total: int, where: str) -> str:
    """'14 of 21 tensors in X are not finite: a, b, c, d, e, ...'"""
    shown = ", ".join(bad[:SHOWN_BAD_TENSORS]) + (", ..." if len(bad) > SHOWN_BAD_TENSORS else "")
    return "%d of %d tensors in %s are not finite (nan/inf): %s" % (len(bad), total, where, shown)


def nonfinite_safetensors(folder: str) -> tuple[list[str], int]:
    """(names of the tensors with a nan/inf, tensors checked) over every *.safetensors in folder,
    one tensor in memory at a time. Needs torch and safetensors (the box venv)."""
    import torch
    from safetensors import safe_open

    bad: list[str] = []
    total = 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(folder, name), framework="pt") as f:
            for key in f.keys():
                total += 1
                tensor = f.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    bad.append(key)
    return bad, total


def nonfinite_state(named_tensors: Iterable[tuple[str, Any]]) -> tuple[list[str], int]:
    """The same over (name, tensor) pairs held in memory (a merged model before it is saved)."""
    import torch

    bad: list[str] = []
    total = 0
    for key, tensor in named_tensors:
        total += 1
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad.append(key)
    return bad, total


def gguf_reader(path: str) -> Any:
    """gguf-py's reader: the copy provision unpacked with the converter, else an installed one."""
    bundled = os.path.join(sys.prefix, "llama.cpp", "gguf-py")
    if os.path.isdir(bundled) and bundled not in sys.path:
        sys.path.insert(0, bundled)
    from gguf import GGUFReader

    return GGUFReader(path)


def nonfinite_gguf(path: str) -> tuple[list[str], int, int]:
    """(bad names, F32/F16 tensors checked, quantized tensors not looked into) of a GGUF file.
    Quantized blocks are not decoded here: the GGUF checker vets the file's structure."""
    import numpy as np

    bad: list[str] = []
    checked = quantized = 0
    for tensor in gguf_reader(path).tensors:
        if tensor.tensor_type.name not in ("F32", "F16"):
            quantized += 1
            continue
        checked += 1
        if not bool(np.isfinite(tensor.data).all()):
            bad.append(tensor.name)
    return bad, checked, quantized


def refuse_nonfinite_gguf(path: str, marker_name: str, what: str, rc: int, bad_name: str | None = None) -> None:
    """fail(marker_name) when an F32/F16 tensor of the GGUF at path holds a nan/inf (the file then
    moved to bad_name, if given, where nothing downstream reads it); says what was covered."""
    bad, checked, quantized = nonfinite_gguf(path)
    if bad:
        if bad_name:
            os.replace(path, bad_name)
        fail(marker_name, "%s: %s" % (what, bad_tensors_text(bad, checked, bad_name or path)), rc=rc)
    say("%s: all %d F32/F16 tensors finite%s" % (path, checked, " (%d quantized tensors: structure checked only)"
                                                 % quantized if quantized else ""))
