"""The log pane's cursor: which log it shows (a stage's, or a file) and where in it. The box
screen's session alone has one (the watcher and the fleet rows show no log): its follower rides
along with each poll, and what it brought is the update's LogLines."""

from __future__ import annotations

from samai.console.core.config import Config
from samai.console.core.update import LogLines
from samai.remote.follow import LogFollower
from samai.remote.model import LogChunk, Marker

SHOWN_CATCH_UP = 1024 * 1024  # the log pane behind a burst reads up to this per poll (its lines are rendered at once)


class LogCursor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.follower: LogFollower | None = None
        self.stage: str | None = None

    def show_log(self, path: str, stage: str | None = None, offset: int | None = None) -> LogFollower:
        """A log on show: its last lines, or (offset) from that byte on."""
        self.follower = LogFollower(self.config.path_of(path), offset=offset, last_lines=self.config.ui.tail_lines,
                                    catch_up_bytes=SHOWN_CATCH_UP)
        self.stage = stage
        return self.follower

    def show_stage_log(self, name: str) -> LogFollower:
        stage = self.config.stage(name)
        if stage is None:
            raise KeyError(f"no stage {name!r} in the config")
        return self.show_log(stage.log, stage.name)

    def markers(self) -> tuple[Marker, ...]:
        stage = self.config.stage(self.stage) if self.stage else None
        return stage.markers if stage else ()

    @property
    def path(self) -> str | None:
        return self.follower.path if self.follower else None

    def new_runs(self, stages: set[str]) -> str | None:
        """Stages whose new run started this poll: the shown one's log starts again with the new
        run's file (the last run's is NAME.1). The stage restarted, if it is the shown one."""
        if self.stage in stages and self.follower is not None:
            self.follower = LogFollower(self.follower.path, offset=0, catch_up_bytes=SHOWN_CATCH_UP)
            return self.stage
        return None

    def consume(self, follower: LogFollower, chunk: LogChunk | None, restarted: str | None) -> LogLines | None:
        """What the shown log brought this poll: its chunk's lines when `follower` (whose cursor the
        poll carried) is still the one shown, and the restart of its stage's log (None: nothing)."""
        shown = self.follower
        if shown is None:
            return None
        if follower is shown and chunk is not None:
            tail = follower.consume(chunk)
            return LogLines(shown, self.stage, shown.path, self.markers(), tail.lines, tail.notice, restarted)
        return LogLines(shown, self.stage, shown.path, self.markers(), restarted=restarted) if restarted else None
