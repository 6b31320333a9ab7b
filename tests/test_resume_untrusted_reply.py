"""The resume reads the box's judgement of its checkpoints as untrusted input (issue 46, item 4):
a name becomes a path in the resumed run's command line, so only checkpoint-STEP of its own step
is taken."""

from __future__ import annotations

from samai.console.core.training import resume
from samai.remote import model
from tests.test_checkpoints import FOLDER


def test_the_resume_takes_no_name_but_a_checkpoint_of_its_own_step() -> None:
    """The box's reply is read as untrusted: a name that is not checkpoint-STEP of its step (a
    path, another step's folder) is passed over, whatever the rest of its judgement says."""
    whole = {"mtime": 1.0, "bytes": 10, "files": 7, "complete": True, "finite": True}
    found = model.checkpoints({"folder": FOLDER, "checkpoints": [
        {"name": "../../elsewhere", "step": 30, **whole}, {"name": "checkpoint-4", "step": 20, **whole},
        {"name": "checkpoint-10", "step": 10, **whole}]})
    choice = resume.choose(found, [])
    assert choice.chosen is not None and choice.chosen.name == "checkpoint-10"
    assert [p.why for p in choice.passed] == ["not a checkpoint-STEP folder of its own step"] * 2
