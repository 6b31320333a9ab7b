"""Preflight of a multimodal serve stage from the files themselves: the `--mmproj` GGUF must be a
projector (general.architecture "clip", with what llama.cpp's clip loader needs) and feed
embeddings as wide as the model's (`clip.vision.projection_dim` == `{arch}.embedding_length` of the
command's -m/--model GGUF), or llama.cpp refuses the pair when the server starts. Both headers are
read through the Box (byte ranges on a remote box, as `check gguf` reads them) when the stage is
about to fire, like the training evidence (evidence.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from samai.console.core.config import Config, Stage
from samai.console.core.mmproj import declared, mmproj_artifact, on_box, projector_stage
from samai.console.core.preflight import Check
from samai.remote.boxapi import Box, BoxError
from samai.remote.model import Snapshot
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.console.core.checks import GgufResult

SHOWN_PROBLEMS = 3
CLIP = "clip"


async def projector_evidence(box: Box, cfg: Config, stage: Stage, snap: Snapshot | None = None) -> tuple[Check, ...]:
    """The checks of a multimodal serve stage's projector against its model (none for another
    stage). snap: the fire's snapshot; a declared artifact it finds missing was said by the preflight."""
    serve = projector_stage(cfg, stage)
    if serve is None:
        return ()
    artifact = mmproj_artifact(cfg)
    path = serve.mmproj if serve.mmproj is not None else artifact.path if artifact else None
    if path is None:
        return ()
    projector = await _read(box, cfg, snap, "mmproj", path)
    if isinstance(projector, tuple):
        return projector
    found = _projector_problems(path, projector)
    width = projector.projector.projection_dim if projector.projector else None
    if found or width is None:
        return tuple(found)
    if serve.model is None:
        return (Check("warning", f"mmproj {path}: the command names no -m/--model GGUF to match it against"),)
    model = await _read(box, cfg, snap, "model", serve.model)
    if isinstance(model, tuple):
        return model
    return (_match(path, projector, width, serve.model, model),)


async def _read(box: Box, cfg: Config, snap: Snapshot | None, what: str, path: str) -> GgufResult | tuple[Check, ...]:
    """The header of the file a command names, or the checks that say why it cannot be judged."""
    from samai.console.core.checks import Unreadable, check_gguf  # the box's GGUF checker: only here

    where = on_box(cfg, path)
    if where is None:
        return (Check("warning", f"{what} {path}: a path with a shell variable; its header is not checked"),)
    try:
        return await check_gguf(box, where, expect_tensors=None, expect_last=None, local=cfg.target.is_local)
    except (Unreadable, BoxError, TransportError) as e:
        if _said_missing(cfg, snap, path):
            return ()
        return (Check("error", f"{what} {path} cannot be read: {e}"),)


def _said_missing(cfg: Config, snap: Snapshot | None, path: str) -> bool:
    """A declared artifact the snapshot found missing: the preflight said so already."""
    known = declared(cfg, path)
    if snap is None or known is None:
        return False
    sized = next((a for a in snap.artifacts if a.name == known.name), None)
    return sized is not None and not sized.exists


def _projector_problems(path: str, result: GgufResult) -> list[Check]:
    """What makes the file no usable projector: not one at all, or one the loader refuses."""
    if result.ok and result.architecture != CLIP:
        arch = "absent" if result.architecture is None else repr(result.architecture[:40])
        return [Check("error", f"mmproj {path} is not a projector: its general.architecture is {arch}, not "
                               f"\"{CLIP}\" (a text model given as --mmproj? convert with --mmproj)")]
    errors = [p for p in result.problems if p.severity == "error"]
    found = [Check("error", f"mmproj {path}: {p.code}: {p.message}") for p in errors[:SHOWN_PROBLEMS]]
    if len(errors) > SHOWN_PROBLEMS:
        found.append(Check("error", f"mmproj {path}: {len(errors) - SHOWN_PROBLEMS} more problems (check gguf)"))
    return found


def _match(mmproj_path: str, projector: GgufResult, width: int, model_path: str, model: GgufResult) -> Check:
    """projection_dim against the model's embedding size: both numbers, both paths."""
    key = f"{model.architecture}.embedding_length"
    if model.embedding_length is None:
        broken = next((p for p in model.problems if p.severity == "error"), None)
        why = f"its header is broken ({broken.code}: {broken.message})" if broken else f"it has no {key}"
        return Check("error" if broken else "warning", f"model {model_path}: {why}: the projector {mmproj_path} "
                                                       f"(projection_dim {width}) cannot be matched to it")
    if model.embedding_length != width:
        return Check("error", f"mmproj {mmproj_path} does not match model {model_path}: its "
                              f"clip.vision.projection_dim is {width}, the model's {key} is "
                              f"{model.embedding_length}; llama.cpp refuses the pair (use the mmproj converted "
                              "from this model)")
    kind = (projector.projector.projector_type if projector.projector else None) or "?"
    return Check("ok", f"mmproj {mmproj_path} ({kind[:40]}) matches model {model_path}: embedding size {width}")
