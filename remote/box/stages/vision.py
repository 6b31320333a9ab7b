"""What the multimodal (image + text) stages share: the tiny VLM's format, its data, and the guards
of playbook §10 (LoRA on the language model only; vision tower and merger frozen, and asserted so).

The tiny VLM is a Qwen2.5-VL (transformers Qwen2_5_VLForConditionalGeneration) built small from a
config: the family the playbook's real model belongs to (a vision tower + a "merger" projector
into the language model), one that llama.cpp's converter and llama-server handle (--mmproj), and
one whose ViT has gate_proj/up_proj/down_proj of its own: a LoRA target list written for a text
model silently trains the vision tower too (the trap).

Runs ON the box, imported by the stage scripts. Standard library only at import time: the ML stack
(torch, transformers, Pillow) is imported inside the functions that need it, in the box venv.
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any

from .images import inside

# LoRA on the language model's projections only: never the ViT's (playbook §10).
LORA_REGEX = r".*language.*\.(q|k|v|o|gate|up|down)_proj"
# The tokens the Qwen2-VL family frames an image with; llama.cpp's mtmd writes the same two around
# the image's embeddings, so the model sees one framing in training and in serving.
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
SPECIAL_TOKENS = (VISION_START, IMAGE_PAD, VISION_END)
# The chat format: an image part is the framed image, then the text; llama-server renders a
# message's image as its media marker in the same place, then mtmd frames it the same way.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Q"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}"
    "{% if c['type'] == 'image' or c['type'] == 'image_url' %}" + VISION_START + IMAGE_PAD + VISION_END +
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% elif m['role'] == 'assistant' %}A{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A{% endif %}"
)
# What the base is pretrained on: the same question and answer without the chat format
# ("<image>colour?=red"), which the LoRA then teaches, as the text pipeline's base knows its facts.
PRETRAIN_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}"
    "{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}" + VISION_START + IMAGE_PAD + VISION_END +
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}="
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
QUESTION = "colour?"
COLOURS = {
    "red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (240, 220, 20),
    "black": (10, 10, 10), "purple": (140, 40, 170), "orange": (250, 140, 0),
}
SHAPES = ("square", "circle", "triangle")
BACKGROUNDS = ((255, 255, 255), (200, 200, 200), (235, 235, 220))
SIDES = (84, 112, 140, 168)  # multiples of 28 (patch 14 x merge 2): no resize on either side
# Both sides resize an image to between 8 and 64 merged tokens (llama-server --image-max-tokens 64).
MIN_PIXELS, MAX_PIXELS = 8 * 28 * 28, 64 * 28 * 28
SMOKE_IMAGE, SMOKE_ANSWER = "smoke.png", "red"
IMAGE_GROUPS = ("vision", "merger")


def render(rng: random.Random, colour: str, shape: str, size: tuple[int, int] | None = None) -> Any:
    """A shape of one colour on a plain background, of a random size and place (Pillow)."""
    from PIL import Image, ImageDraw

    width, height = size or (rng.choice(SIDES), rng.choice(SIDES))
    img = Image.new("RGB", (width, height), rng.choice(BACKGROUNDS))
    draw = ImageDraw.Draw(img)
    side = rng.randint(min(width, height) // 2, min(width, height) - 10)
    x, y = rng.randint(0, width - side), rng.randint(0, height - side)
    fill = COLOURS[colour]
    if shape == "square":
        draw.rectangle([x, y, x + side, y + side], fill=fill)
    elif shape == "circle":
        draw.ellipse([x, y, x + side, y + side], fill=fill)
    else:
        draw.polygon([(x + side // 2, y), (x, y + side), (x + side, y + side)], fill=fill)
    return img


def samples(count: int, seed: int) -> list[tuple[str, str]]:
    """(colour, shape) pairs covering every colour evenly."""
    rng = random.Random(seed)
    names = sorted(COLOURS)
    return [(names[i % len(names)], rng.choice(SHAPES)) for i in range(count)]


def messages(image_path: str, answer: str | None = None) -> list[dict[str, Any]]:
    """One question about one image, in the chat format (the answer left out for a prompt)."""
    turn = [{"role": "user", "content": [{"type": "image", "image": image_path}, {"type": "text", "text": QUESTION}]}]
    return turn + ([{"role": "assistant", "content": answer}] if answer is not None else [])


def write_data(folder: str, train_count: int, eval_count: int, seed: int = 11) -> None:
    """data/: images/, train.jsonl (chat messages naming their image), eval.jsonl (image, prompt,
    gold) and the smoke image. The eval set has one photo-sized image (1600x1200) to show the
    eval stage's 1120 px cap at work."""
    rng = random.Random(seed)
    images = os.path.join(folder, "images")
    os.makedirs(images, exist_ok=True)
    with open(os.path.join(folder, "train.jsonl"), "w") as f:
        for i, (colour, shape) in enumerate(samples(train_count, seed)):
            name = "images/train-%04d.png" % i
            render(rng, colour, shape).save(os.path.join(folder, name))
            f.write(json.dumps({"messages": messages(name, colour)}) + "\n")
    with open(os.path.join(folder, "eval.jsonl"), "w") as f:
        for i, (colour, shape) in enumerate(samples(eval_count, seed + 1)):
            name = "images/eval-%04d.png" % i
            render(rng, colour, shape, (1600, 1200) if i == 0 else None).save(os.path.join(folder, name))
            f.write(json.dumps({"id": i, "image": name, "prompt": QUESTION, "gold": colour}) + "\n")
    render(rng, SMOKE_ANSWER, "square", (112, 112)).save(os.path.join(folder, SMOKE_IMAGE))
    write_cu_tasks(folder)


# Instructions the tiny model was never taught (it knows "colour?" alone): it answers some with a
# colour, others with a blend of colour names. A reward-driven round is what teaches them.
CU_INSTRUCTIONS = ("press the colour?", "the colour? press it", "click the colour?", "colour? press it")
CU_VIEWPORT = (224, 224)  # 8 x 8 merged patches of 28 px: an image within --image-max-tokens 64
CU_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>task %(id)s</title><style>
body { margin: 0; background: %(background)s; font: 9px sans-serif; }
#shape { position: absolute; left: %(x)dpx; top: %(y)dpx; width: %(side)dpx; height: %(side)dpx;
         background: %(fill)s; %(form)s }
nav { position: absolute; left: 0; right: 0; bottom: 0; height: 22px; display: flex; background: #ccc; }
button { flex: 1; margin: 1px; border: 0; background: #eee; font: 8px sans-serif; padding: 0; }
#result { position: absolute; left: 2px; top: 0; margin: 0; }
</style></head><body>
<div id="shape"></div>
<p id="result"></p>
<nav>%(buttons)s</nav>
<script>
for (const b of document.querySelectorAll("button")) {
  b.addEventListener("click", () => {
    document.getElementById("result").textContent = b.dataset.name;
    location.hash = "pressed-" + b.dataset.name;
  });
}
</script>
</body></html>
"""
CU_FORMS = {"square": "", "circle": "border-radius: 50%;", "triangle": "clip-path: polygon(50% 0, 0 100%, 100% 100%);"}


def write_cu_tasks(folder: str, train_count: int = 56, heldout_count: int = 28, seed: int = 23) -> None:
    """cu/: tasks.jsonl and pages/ for the computer-use eval and its reward-driven round: a page
    with one coloured shape and a bar of buttons named by colour; pressing the button of the
    shape's colour is the success the DOM assertions check (the #result text and the URL)."""
    rng = random.Random(seed)
    pages = os.path.join(folder, "cu", "pages")
    os.makedirs(pages, exist_ok=True)
    names = sorted(COLOURS)
    with open(os.path.join(folder, "cu", "tasks.jsonl"), "w") as f:
        for i, (colour, shape) in enumerate(samples(train_count + heldout_count, seed)):
            split = "train" if i < train_count else "heldout"
            task_id = "%s-%03d" % (split, i)
            side = rng.randint(60, 140)
            page = CU_PAGE % {
                "id": task_id, "background": "rgb(%d, %d, %d)" % rng.choice(BACKGROUNDS),
                "x": rng.randint(0, CU_VIEWPORT[0] - side), "y": rng.randint(12, CU_VIEWPORT[1] - 22 - side),
                "side": side, "fill": "rgb(%d, %d, %d)" % COLOURS[colour], "form": CU_FORMS[shape],
                "buttons": "".join('<button data-name="%s">%s</button>' % (n, n)
                                   for n in rng.sample(names, len(names)))}
            with open(os.path.join(pages, task_id + ".html"), "w") as p:
                p.write(page)
            f.write(json.dumps({
                "id": task_id, "page": "pages/%s.html" % task_id, "split": split,
                "instruction": CU_INSTRUCTIONS[(i // len(COLOURS)) % len(CU_INSTRUCTIONS)],
                "elements": {n: {"selector": 'button[data-name="%s"]' % n} for n in names},
                "assert": [{"check": "text", "selector": "#result", "equals": colour},
                           {"check": "url", "contains": "#pressed-" + colour}]}) + "\n")


def is_multimodal(model_dir: str) -> bool:
    """A model folder whose config has a vision part."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            return "vision_config" in json.load(f)
    except (OSError, ValueError):
        return False


def load_processor(model_dir: str) -> tuple[Any, Any]:
    """(tokenizer, image processor). Not AutoProcessor: on a CPU-only torch it cannot be built
    (its video processor needs torchvision, whose wheels here are built for another torch)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir), AutoImageProcessor.from_pretrained(model_dir)


def save_processor(tok: Any, image_processor: Any, folder: str) -> None:
    """The tokenizer, the image processor, and added_tokens.json: llama.cpp's converter reads the
    special tokens of a SentencePiece vocab from it (transformers no longer writes it), and without
    it llama.cpp splits <|vision_start|> into characters."""
    tok.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    added = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    with open(os.path.join(folder, "added_tokens.json"), "w") as f:
        json.dump(added, f)


def expand_image_pads(text: str, counts: list[int]) -> str:
    """Each image's single pad token repeated as many times as the image has merged tokens."""
    parts = text.split(IMAGE_PAD)
    if len(parts) - 1 != len(counts):
        raise ValueError("%d images for %d image places" % (len(counts), len(parts) - 1))
    return parts[0] + "".join(IMAGE_PAD * counts[i] + rest for i, rest in enumerate(parts[1:]))


def encode(tok: Any, image_processor: Any, examples: list[tuple[Any, list[dict[str, Any]]]],
           template: str | None = None, merge: int = 2) -> dict[str, Any]:
    """A padded training batch from [(PIL image, messages)], the prompt (everything before the
    answer, the image's tokens included) labelled -100: the prefix mask of the text pipeline.
    template: a chat template other than the tokenizer's own."""
    import torch

    pixels = image_processor(images=[img for img, _ in examples], return_tensors="pt")
    counts = (pixels["image_grid_thw"].prod(-1) // (merge * merge)).tolist()
    rows = []
    for (_, msgs), count in zip(examples, counts):  # noqa: B905 (Python 3.8 on the box; equal lengths)
        full = expand_image_pads(tok.apply_chat_template(msgs, tokenize=False, chat_template=template), [count])
        prompt = expand_image_pads(tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True,
                                                           chat_template=template), [count])
        ids = tok(full, add_special_tokens=False)["input_ids"]
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        rows.append((ids, [-100] * n_prompt + ids[n_prompt:]))
    width = max(len(ids) for ids, _ in rows)
    pad = tok.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]),
        "labels": torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows]),
        "mm_token_type_ids": (input_ids == tok.convert_tokens_to_ids(IMAGE_PAD)).long(),
        "pixel_values": pixels["pixel_values"],
        "image_grid_thw": pixels["image_grid_thw"],
    }


def image_of(msgs: list[dict[str, Any]], folder: str) -> Any:
    """The PIL image a training example's user turn names, read from inside folder."""
    from PIL import Image

    for part in msgs[0]["content"]:
        if isinstance(part, dict) and part.get("type") == "image":
            with Image.open(inside(folder, part["image"])) as img:  # never a path out of folder
                return img.convert("RGB")
    raise ValueError("no image in the example's first message")


def load_examples(path: str) -> list[tuple[Any, list[dict[str, Any]]]]:
    """[(PIL image, messages)] from a train.jsonl whose images lie beside it."""
    folder = os.path.dirname(os.path.abspath(path))
    examples = []
    with open(path) as f:
        for line in f:
            if line.strip():
                msgs = json.loads(line)["messages"]
                examples.append((image_of(msgs, folder), msgs))
    return examples


def group_of(name: str) -> str:
    """Which part of a VLM a parameter or module belongs to, by its name."""
    if re.search(r"(^|\.)visual\.merger\.", name) or ".multi_modal_projector." in name:
        return "merger"
    if re.search(r"(^|\.)(visual|vision_tower|vision_model)\.", name):
        return "vision"
    if "language_model" in name:
        return "language"
    return "lm_head" if "lm_head" in name else "other"


def freeze_vision(model: Any) -> None:
    """requires_grad off for every vision tower and merger parameter, whatever LoRA did."""
    for name, param in model.named_parameters():
        if group_of(name) in IMAGE_GROUPS:
            param.requires_grad_(False)


def trainable_by_group(model: Any) -> dict[str, int]:
    """{group: trainable parameter count}, every group present (0 where none is trainable)."""
    counts = {g: 0 for g in ("vision", "merger", "language", "lm_head", "other")}
    for name, param in model.named_parameters():
        if param.requires_grad:
            counts[group_of(name)] += param.numel()
    return counts


def lora_modules_in_vision(model: Any) -> list[str]:
    """Names of the modules LoRA wrapped inside the vision tower or the merger (the trap)."""
    return sorted(name for name, module in model.named_modules()
                  if hasattr(module, "lora_A") and group_of(name + ".") in IMAGE_GROUPS)


def why_vision_not_frozen(model: Any) -> str | None:
    """The reason this VLM must not be trained as it is, or None: a LoRA target matched a vision
    module, or a vision/merger parameter is trainable."""
    caught = lora_modules_in_vision(model)
    if caught:
        return ("%d LoRA targets matched vision modules (e.g. %s): a target list written for a text model "
                "catches the ViT's projections; use a regex on the language model such as %s"
                % (len(caught), ", ".join(caught[:3]), LORA_REGEX))
    counts = trainable_by_group(model)
    thawed = {g: counts[g] for g in IMAGE_GROUPS if counts[g]}
    if thawed:
        return "trainable parameters in the image side: %s" % ", ".join("%s %d" % kv for kv in sorted(thawed.items()))
    return None
