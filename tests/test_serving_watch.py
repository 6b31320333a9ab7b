"""The serving watch (console/core/serving/watch.py): which ports are asked and when, the view of
a port from its answers (a real llama-server's, recorded), and serve_hung, serve_queue, ctx_full."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from samai.console.core import config
from samai.console.core.kinds import ActionKind
from samai.console.core.serving.watch import ServingWatch
from samai.console.core.state import ConsoleState
from samai.remote.model import EndpointAnswer, PortAnswers, Snapshot
from tests import factories

RECORDED = Path(__file__).parent / "data" / "serving" / "llamacpp"
PORT = 18080
CONFIG = f"""
[serve]
hung_after_s = 10
every_s = 3
[stages.serve]
key = "v"
command = "serve"
ports = [{PORT}]
[stages.train]
key = "t"
command = "train"
"""


def cfg(extra: str = "") -> config.Config:
    return config.parse(CONFIG + extra, "(test)")


def answers(state: str, *, skip: tuple[str, ...] = (), port: int = PORT) -> PortAnswers:
    """The recorded server's answers in `state` (tests/data/serving), as the probe sends them."""
    got = []
    for path, name in (("/health", "health.json"), ("/metrics", "metrics.txt"), ("/slots", "slots.json"),
                       ("/props", "props.json")):
        if path not in skip:
            got.append(EndpointAnswer(path, 200, (RECORDED / f"{state}.{name}").read_text(), 0.004))
        else:
            got.append(EndpointAnswer(path, 404, "File Not Found", 0.002))
    return PortAnswers(port, tuple(got))


SILENT = PortAnswers(PORT, tuple(EndpointAnswer(p, None, "", 0.8, error="no answer within 0.8 s")
                                 for p in ("/health", "/metrics", "/slots", "/props")))


def snap(at: float, *serving: PortAnswers, serving_runs: bool = True) -> Snapshot:
    server = factories.process(900, argv=("llama-server", "--port", str(PORT)))
    states = [factories.running(server, "serve")] if serving_runs else [factories.stage_record("serve")]
    return factories.snapshot(time=at, processes=[server], states=states, serving=serving)


def codes(watch: ServingWatch, s: Snapshot) -> list[str]:
    return [f.code for f in watch.findings(s)]


def test_the_ports_of_running_serve_stages_are_asked_at_their_pace() -> None:
    watch = ServingWatch(cfg())
    assert watch.due(["train"], 0.0) == []  # no serve stage runs: nothing asked
    assert watch.due(["serve", "train"], 100.0) == [PORT]
    assert watch.due(["serve"], 101.0) == []  # [serve] every_s = 3
    assert watch.due(["serve"], 103.0) == [PORT]


def test_props_are_asked_once_per_server_until_they_answer_and_after_a_restart() -> None:
    """The model and its context do not change while a server runs: /props is asked at its first
    read, again while it has not answered, and again when another socket listens on the port."""
    watch = ServingWatch(cfg())

    def asked(at: float) -> list[int]:
        return watch.request(["serve"], at)["props"]

    def read(at: float, reply: PortAnswers, inode: int = 1) -> None:
        watch.findings(replace(snap(at, reply), listeners=(factories.listener(PORT, pid=900, inode=inode),)))

    assert asked(100.0) == [PORT]
    read(100.0, answers("idle", skip=("/props",)))  # not answered: asked again
    assert asked(103.0) == [PORT]
    read(103.0, answers("idle"))
    assert asked(106.0) == [] and watch.views[PORT].props is not None
    read(106.0, answers("busy", skip=("/props",)))  # not asked this time: what it said stands
    assert watch.views[PORT].props is not None and watch.views[PORT].props.n_ctx == 256
    read(109.0, answers("idle", skip=("/props",)), inode=2)  # restarted, perhaps with another model
    assert watch.views[PORT].props is None and asked(112.0) == [PORT]


def test_a_busy_server_s_view() -> None:
    watch = ServingWatch(cfg())
    watch.findings(snap(100.0, answers("idle")))
    watch.findings(snap(103.0, answers("busy")))
    v = watch.views[PORT]
    assert (v.health, v.health_ok, v.running, v.waiting) == ("ok", True, 2, 1)
    assert v.metrics is not None and v.metrics.engine == "llama.cpp" and v.props and v.props.n_ctx == 256
    assert v.generation_tps is not None and v.generation_tps > 0 and v.kv_use and 0 < v.kv_use < 1
    assert v.to_json()["requests_waiting"] == 1 and len(v.to_json()["slots"]) == 2
    json.dumps(v.to_json())


def test_requests_that_make_no_progress_are_serve_hung_until_they_do() -> None:
    watch = ServingWatch(cfg())
    assert codes(watch, snap(100.0, answers("busy"))) == []
    assert codes(watch, snap(105.0, answers("busy"))) == []  # the same answers: 5 s without progress
    [hung] = watch.findings(snap(111.0, answers("busy")))
    assert hung.code == "serve_hung" and "alive but stuck" in hung.message
    assert hung.action is not None and (hung.action.kind, hung.action.stage) == (ActionKind.RESTART, "serve")
    assert [f.message for f in watch.findings(snap(114.0, answers("busy")))] == [hung.message]  # the same finding
    assert codes(watch, snap(117.0, answers("done"))) == []  # it moved on


def test_an_idle_server_is_not_hung() -> None:
    watch = ServingWatch(cfg())
    for at in (100.0, 110.0, 130.0):
        assert codes(watch, snap(at, answers("idle"))) == []


def test_a_silent_health_is_serve_hung_after_the_window_and_at_once_for_doctor() -> None:
    watch = ServingWatch(cfg())
    watch.findings(snap(100.0, answers("idle")))
    assert codes(watch, snap(103.0, SILENT)) == []  # silent since 103
    assert codes(watch, snap(109.0, SILENT)) == []
    assert codes(watch, snap(113.0, SILENT)) == ["serve_hung"]
    assert watch.views[PORT].health.startswith("no answer within")
    assert codes(watch, snap(116.0, answers("idle"))) == []
    assert codes(ServingWatch(cfg(), one_look=True), snap(100.0, SILENT)) == ["serve_hung"]


def test_a_server_without_metrics_shows_what_it_can_and_says_why() -> None:
    watch = ServingWatch(cfg())
    watch.findings(snap(100.0, answers("busy", skip=("/metrics",))))
    v = watch.views[PORT]
    assert v.metrics is None and "--metrics" in v.metrics_note and "HTTP 404" in v.metrics_note
    assert v.running == 2 and v.kv_use is not None  # from the slots
    watch.findings(snap(103.0, answers("busy", skip=("/metrics", "/slots"))))
    assert "/slots" in watch.views[PORT].slots_note and watch.views[PORT].running is None


def _slot_answers(used: int, n_ctx: int = 256) -> PortAnswers:
    slots = json.dumps([{"id": 0, "n_ctx": n_ctx, "is_processing": True, "n_prompt_tokens": used,
                         "next_token": [{"n_decoded": used - 5, "n_remain": 100}]}])
    busy = answers("busy")
    return PortAnswers(PORT, tuple(EndpointAnswer("/slots", 200, slots, 0.01) if a.path == "/slots" else a
                                   for a in busy.answers))


def test_a_slot_at_its_context_limit_is_ctx_full() -> None:
    assert codes(ServingWatch(cfg()), snap(100.0, answers("ctx_near_full"))) == []  # 241 of 256
    assert codes(ServingWatch(cfg()), snap(100.0, _slot_answers(254))) == ["ctx_full"]


def test_deferred_requests_growing_is_serve_queue() -> None:
    watch = ServingWatch(cfg())
    text = (RECORDED / "busy.metrics.txt").read_text()
    for i, at in enumerate((100.0, 103.0, 106.0, 109.0)):
        grown = text.replace("llamacpp:requests_deferred 1", f"llamacpp:requests_deferred {i + 1}")
        grown = grown.replace("llamacpp:tokens_predicted_total 0", f"llamacpp:tokens_predicted_total {i * 50}")
        port = PortAnswers(PORT, tuple(EndpointAnswer(a.path, 200, grown if a.path == "/metrics" else a.body, 0.01)
                                       for a in answers("busy").answers))
        found = codes(watch, snap(at, port))
    assert found == ["serve_queue"]


def test_a_stage_that_stops_is_forgotten() -> None:
    watch = ServingWatch(cfg())
    watch.findings(snap(100.0, answers("busy")))
    assert watch.findings(snap(103.0, serving_runs=False)) == [] and watch.views == {}


def test_the_state_asks_the_serving_ports_and_raises_serve_hung() -> None:
    state = ConsoleState(cfg())
    state.apply(snap(100.0, answers("busy")), [], 100.0)
    assert state.request([])["serving"] == [PORT]
    assert state.request([])["serving"] == []  # not again before [serve] every_s
    for at in (103.0, 107.0, 112.0):
        update = state.apply(snap(at, answers("busy")), [], at)
    assert [a.code for a in state.alerts if a.active and a.code in ("serve_hung", "serve_queue", "ctx_full")] \
        == ["serve_hung"]
    assert update.alerts_changed


def test_a_hung_server_is_a_recovery_the_watcher_may_run_once_per_hang() -> None:
    """[watch] recover = ["restart_hung_serve"]: serve_hung's fix is due, once for each time it is
    raised; restart_serve (a dead server) does not take a hang."""
    from dataclasses import replace

    from samai.console.core.watch.recover import RecoveryBook, recoveries_due

    state = ConsoleState(cfg())
    for at in (100.0, 103.0, 107.0, 112.0):
        state.apply(snap(at, answers("busy")), [], at)
    [hung] = [a for a in state.alerts if a.code == "serve_hung"]
    book = RecoveryBook()
    policy = cfg(extra='[watch]\nrecover = ["restart_hung_serve"]\n')
    [due] = recoveries_due(policy, [hung], book)
    assert (due.stage, due.kind) == ("serve", ActionKind.RESTART)
    assert recoveries_due(cfg(extra='[watch]\nrecover = ["restart_serve"]\n'), [hung], book) == []
    book.done[due.key] = 112.0
    assert recoveries_due(policy, [hung], book) == []  # this hang: handled
    again = replace(hung, time=hung.time + 600)  # the same server hung again later
    assert len(recoveries_due(policy, [again], book)) == 1


def test_an_idle_server_is_sent_a_canary_at_most_once_a_minute() -> None:
    watch = ServingWatch(cfg())
    assert watch.request(["serve"], 100.0) == {"serving": [PORT], "props": [PORT], "canary": []}  # nothing read yet
    watch.findings(snap(100.0, answers("idle")))
    assert watch.request(["serve"], 103.0) == {"serving": [PORT], "props": [], "canary": [PORT]}
    assert watch.request(["serve"], 106.0)["canary"] == []  # within the minute
    watch.findings(snap(107.0, answers("busy")))
    assert watch.request(["serve"], 170.0)["canary"] == []  # busy: its progress says enough


def _with_canary(state: str, canary: EndpointAnswer) -> PortAnswers:
    return PortAnswers(PORT, (*answers(state).answers, canary))


def test_a_canary_that_does_not_finish_is_serve_hung() -> None:
    watch = ServingWatch(cfg())
    waiting = EndpointAnswer("canary", None, "", 4.0, error="no answer within 4.0 s")
    assert codes(watch, snap(100.0, _with_canary("idle", waiting))) == []
    [hung] = watch.findings(snap(106.0, _with_canary("idle", EndpointAnswer("canary", None, "", 10.5,
                                                                            error="no answer within 10.5 s"))))
    assert hung.code == "serve_hung" and "1-token request" in hung.message
    done = EndpointAnswer("canary", 200, '{"choices": []}', 0.09)
    assert codes(watch, snap(109.0, _with_canary("idle", done))) == []
    watch.findings(snap(112.0, answers("idle")))
    assert watch.views[PORT].canary == "ok in 90 ms"  # said until the next one
