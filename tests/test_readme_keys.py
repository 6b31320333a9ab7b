"""README's table of the pipeline's stages says each built-in pipeline's keys (issue 49, item 5:
it said 0 was restore where vlm-tiny's 0 is cu_eval): read back against the pipelines themselves."""

from __future__ import annotations

from pathlib import Path

from samai.console.core import config

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| stage | key in "  # then a column per set of pipelines that share their keys
ABSENT = "—"


def _stage_table() -> tuple[list[str], list[list[str]]]:
    """The key columns' titles, and the rows: a stage and its keys (the last column, prose, left out)."""
    lines = README.read_text("utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    table = [lines[start]]
    for line in lines[start + 2:]:  # under the |---| line, to the first line that is no row
        if not line.startswith("|"):
            break
        table.append(line)
    width = lines[start].count(" | ")  # the columns before the prose
    cells = [[c.strip() for c in line.split("|")[1:width + 1]] for line in table]
    return cells[0][1:], cells[1:]


def test_the_readme_says_the_keys_of_every_built_in_pipeline_as_its_config_does() -> None:
    titles, rows = _stage_table()
    assert all(any(key != ABSENT for key in row[1:]) for row in rows), "a row of a stage in no pipeline"
    said: dict[str, dict[str, str]] = {}
    for column, title in enumerate(titles, 1):
        for pipeline in title.removeprefix("key in ").split(", "):
            assert pipeline not in said, f"{pipeline} in two columns"
            said[pipeline] = {row[0]: row[column] for row in rows if row[column] != ABSENT}
    assert sorted(said) == sorted(config.BUILTIN_PIPELINES)
    for name in config.BUILTIN_PIPELINES:
        stages = {stage.name: stage.key for stage in config.load_builtin(name).stages}
        assert said[name] == stages, f"README's stage table, {name}"
