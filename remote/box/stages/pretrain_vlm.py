"""Make the tiny VLM's base model: a Qwen2.5-VL small enough for a CPU, that knows colours.

Built from a config (vision tower of 4 blocks with window attention, a merger, a 2-layer language
model; a character-level SentencePiece tokenizer with the image tokens), then every weight is
trained on rendered shapes: "colour?" about an image, answered with its colour, without the chat
format ("<image>colour?=red"). The train stage then teaches the chat format with a LoRA on the
language model alone (playbook §10).
Writes the model, the tokenizer, the image processor and a manifest.json into --out; with
--data-out also the fine-tuning and eval sets (images beside them) and the smoke image.

Runs ON the box, in the box venv:
  python -m samai_box.stages.pretrain_vlm --out source/vlm-base --data-out source/vlm-data
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

from . import vision
from .common import marker, say
from .pretrain import begin, build_tokenizer, parser, train, write_manifest

VISION_DEPTH = 4  # llama.cpp's converter maps the merger's mlp.2 only in a tower of 3 blocks or more
FULL_ATTENTION_BLOCKS = [1, 3]  # window attention elsewhere, every 2nd block full: as Qwen2.5-VL


def build_model(tok: Any, hidden: int, layers: int, heads: int) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {t: tok.convert_tokens_to_ids(t) for t in vision.SPECIAL_TOKENS}
    head_dim = hidden // heads
    text = dict(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2 + hidden // 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
        # M-RoPE: the rotary half of each head split over (time, height, width) as Qwen does
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "mrope_section": mrope_section(head_dim // 2)})
    visual = dict(depth=VISION_DEPTH, hidden_size=hidden, intermediate_size=hidden * 2, out_hidden_size=hidden,
                  num_heads=heads, fullatt_block_indexes=FULL_ATTENTION_BLOCKS, window_size=112, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=visual, image_token_id=ids[vision.IMAGE_PAD],
        vision_start_token_id=ids[vision.VISION_START], vision_end_token_id=ids[vision.VISION_END],
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    return Qwen2_5_VLForConditionalGeneration(config)


def mrope_section(half: int) -> list[int]:
    """(t, h, w) shares of the rotary half of a head: time the smallest, as Qwen's [16, 24, 24]."""
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def shapes(tok: Any, image_processor: Any, batch: int, seed: int) -> Callable[[int], dict[str, Any]]:
    """batch(step): freshly rendered shapes of random colours each step, in the pretrain format."""
    rng = random.Random(seed)

    def batch_of(step: int) -> dict[str, Any]:
        examples = []
        for _ in range(batch):
            colour, shape = rng.choice(sorted(vision.COLOURS)), rng.choice(vision.SHAPES)
            examples.append((vision.render(rng, colour, shape), vision.messages("-", colour)))
        return vision.encode(tok, image_processor, examples, vision.PRETRAIN_TEMPLATE)

    return batch_of


def main() -> None:
    p = parser(__doc__, hidden=64, steps=400)
    p.add_argument("--train-examples", type=int, default=112)
    p.add_argument("--eval-examples", type=int, default=28)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    started = begin(args)
    if started is None:
        return
    from transformers import Qwen2VLImageProcessorPil

    tok = build_tokenizer(args.out, [vision.QUESTION + "=QA"] + sorted(vision.COLOURS), vision.SPECIAL_TOKENS,
                          vision.CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=vision.MIN_PIXELS, max_pixels=vision.MAX_PIXELS)
    model = build_model(tok, args.hidden, args.layers, args.heads)
    say("tiny Qwen2.5-VL: %d parameters, vocab %d" % (model.num_parameters(), len(tok)))
    loss = train(model, shapes(tok, image_processor, args.batch, args.seed), args.steps, args.lr)
    model.save_pretrained(args.out, safe_serialization=True)
    vision.save_processor(tok, image_processor, args.out)
    write_manifest(args.out)
    if args.data_out:
        vision.write_data(args.data_out, args.train_examples, args.eval_examples)
        write_manifest(args.data_out)
    marker("PRETRAIN_DONE", "%s loss=%.4f in %.0f s" % (args.out, loss, time.time() - started))


if __name__ == "__main__":
    main()
