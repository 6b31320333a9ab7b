"""A multimodal pipeline's projector (playbook §10), as the config and command lines name it:
`[model] mmproj` names the projector's artifact, the serve stage's command carries `--mmproj PATH`
next to the model's `-m/--model PATH`, and a llama-server without `--mmproj` answers images blind.
Text only: reading the files is mmproj_match's job, judging running servers the detectors'."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from samai.console.core.config import Artifact, Config, Stage, command_words

SERVER = "llama-server"
SERVER_OPTION = "--llama-server"  # the box's serve stage module names the binary it runs
MMPROJ_FLAGS = ("--mmproj", "-mm")
MODEL_FLAGS = ("--model", "-m")
# How else llama-server gets a projector: by URL, or downloaded beside a -hf model (unless --no-mmproj).
OTHER_MMPROJ_FLAGS = ("--mmproj-url", "-mmu")
HF_FLAGS = ("-hf", "-hfr", "--hf-repo")
NO_MMPROJ = ("--no-mmproj", "--no-mmproj-auto")
PYTHON = re.compile(r"^python(3(\.[0-9]+)?)?$")
WORKSPACE_VARS = ("${SAMAI_WORKSPACE}", "$SAMAI_WORKSPACE")


@dataclass(frozen=True)
class ServeCommand:
    """What a stage's command says about serving: the model and projector paths as written."""

    model: str | None  # -m/--model (the last one)
    mmproj: str | None  # --mmproj/-mm (the last one)
    runs_server: bool  # it runs llama-server (the binary, or the serve module's --llama-server)


def mmproj_artifact(cfg: Config) -> Artifact | None:
    """The projector's artifact that `[model] mmproj` names: the pipeline is multimodal."""
    name = dict(cfg.model).get("mmproj")
    return cfg.artifact(name) if isinstance(name, str) else None


def serve_command(command: str) -> ServeCommand:
    """The command's words read for the serve options; a command shlex cannot split names nothing."""
    words = command_words(command)
    if words is None:  # unbalanced quotes: the stage cannot run either
        return ServeCommand(None, None, False)
    runs = any(posixpath.basename(w) == SERVER or w == SERVER_OPTION or w.startswith(SERVER_OPTION + "=")
               for w in words)
    return ServeCommand(option(words, MODEL_FLAGS), option(words, MMPROJ_FLAGS), runs)


def option(words: Sequence[str], flags: Sequence[str]) -> str | None:
    """The value of the last of flags in words (`--flag VALUE` or `--flag=VALUE`); a python's own
    `-m MODULE` is not a model."""
    value = None
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        if name not in flags:
            continue
        if name == "-m" and _after_python(words, i):
            continue
        if eq:
            value = inline
        elif i + 1 < len(words):
            value = words[i + 1]
    return value


def _after_python(words: Sequence[str], i: int) -> bool:
    """words[i] is an option of a python interpreter (`python3 -u -m MODULE`)."""
    j = i - 1
    while j >= 0 and words[j].startswith("-"):
        j -= 1
    return j >= 0 and PYTHON.match(posixpath.basename(words[j])) is not None


def projector_stage(cfg: Config, stage: Stage) -> ServeCommand | None:
    """The stage's serve options when it is a multimodal serve stage: its command runs llama-server
    on a model it names, and carries --mmproj or the pipeline has [model] mmproj. None otherwise
    (the convert stage names the --mmproj it writes, and runs no server; rft serves the model and
    projector it makes itself, and names neither)."""
    serve = serve_command(stage.command)
    if serve.runs_server and serve.model is not None and (serve.mmproj is not None
                                                          or mmproj_artifact(cfg) is not None):
        return serve
    return None


def on_box(cfg: Config, path: str) -> str | None:
    """A path from a command, on the box: relative ones are in the workspace (where stages run);
    None when it still holds a shell variable the console cannot know."""
    for var in WORKSPACE_VARS:
        path = path.replace(var, cfg.workspace)
    if "$" in path or "`" in path:
        return None
    return path if posixpath.isabs(path) else posixpath.join(cfg.workspace, path)


def declared(cfg: Config, path: str) -> Artifact | None:
    """The artifact declared at this command path, if any (the probe sizes those in every snapshot)."""
    where = on_box(cfg, path)
    for artifact in cfg.artifacts:
        if where is not None and posixpath.normpath(on_box(cfg, artifact.path) or "") == posixpath.normpath(where):
            return artifact
    return None


def has_mmproj(argv: Sequence[str]) -> bool:
    """A llama-server command line that loads a projector: --mmproj/-mm or --mmproj-url, or a -hf
    model (whose projector it downloads beside it) without --no-mmproj."""
    names = {word.partition("=")[0] for word in argv}
    if names & set(MMPROJ_FLAGS + OTHER_MMPROJ_FLAGS):
        return True
    return bool(names & set(HF_FLAGS)) and not names & set(NO_MMPROJ)
