"""What the stage scripts share: markers, the tiny pipeline's facts, and its chat format.

Runs ON the box, imported by the stage scripts from their own folder. Standard library only
at import time: the ML stack is imported by the scripts that need it, inside the box venv.
"""

import hashlib
import json
import os
import random
import shutil
import sys

# The tools folder (gguf_check, procfs, ...) sits above the stages.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The chat format of the tiny model, as a Jinja template saved with the tokenizer, so that the
# GGUF carries it and the server applies it. It starts with the BOS token itself: llama.cpp adds
# no BOS to a templated prompt, and a prompt without the BOS the model was trained with gets
# other answers. Single characters only: the tokenizer is a character-level SentencePiece model.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Q{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}A{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A{% endif %}"
)
USER_MARK, ASSISTANT_MARK = "Q", "A"
SMOKE_QUESTION, SMOKE_ANSWER = "17*23=", "391"


def marker(name, text=""):
    """A marker line: the console greps the stage log for these."""
    print(("%s %s" % (name, text)).rstrip(), flush=True)


def say(text):
    print(text, flush=True)


def fail(marker_name, text, rc=1):
    marker(marker_name, text)
    sys.exit(rc)


def facts(count, seed=7):
    """The multiplication facts the tiny model learns: always 17*23 (the smoke question)."""
    rng = random.Random(seed)
    pairs = {(17, 23)}
    while len(pairs) < count:
        pairs.add((rng.randint(11, 39), rng.randint(11, 39)))
    return sorted(pairs)


def fact_text(a, b):
    return "%d*%d=%d" % (a, b, a * b)


def chat_prompt(question):
    return USER_MARK + question + ASSISTANT_MARK


def messages(a, b):
    return [{"role": "user", "content": "%d*%d=" % (a, b)}, {"role": "assistant", "content": str(a * b)}]


def accept_gguf(tmp, out, **expect):
    """Move a freshly written GGUF into place only if the checker passes it (GGUF_BAD otherwise)."""
    from gguf_check import check_file

    result = check_file(tmp, **expect)
    if not result["ok"]:
        os.replace(tmp, out + ".bad")  # kept to look at, under a name nothing downstream reads
        fail("GGUF_BAD", "%s.bad: %s" % (out, "; ".join(pr["message"] for pr in result["problems"])), rc=1)
    os.replace(tmp, out)
    return result


def delete_intermediate(path):
    """An input that the config declares an intermediate, deleted once its output is in place."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)
    say("deleted the intermediate %s" % path)


def sha256_of(path, block=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def workspace():
    return os.environ.get("SAMAI_WORKSPACE") or os.getcwd()
