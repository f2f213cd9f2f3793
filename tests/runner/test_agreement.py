"""The controller's side of a change every real rank makes at one boundary:
it holds every rank, names the latest boundary held, and answers with each
rank's agreement, or with the first refusal once every hold is let go."""

from __future__ import annotations

from prism_debug.bus.server import Pending
from prism_debug.controller.cut_verbs import Agreement
from prism_debug.errors import BadArguments


class FakeServer:
    """What an agreement asks of the bus: requests to ranks, one answer."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, str, dict]] = []
        self._replies: dict[int, list] = {}
        self.answer: tuple[str, object] | None = None

    def ask_agent(self, verb, args, on_reply, rank=None):
        self.asked.append((rank, verb, args))
        self._replies.setdefault(rank, []).append(on_reply)

    def reply_from(self, rank: int, message: dict) -> None:
        self._replies[rank].pop(0)(message)

    def reply(self, pending, result):
        self.answer = ("reply", result)

    def fail(self, pending, error):
        self.answer = ("fail", error)


def agreement(server: FakeServer, change: dict) -> Agreement:
    return Agreement(server, (0, 1), Pending(b"client", "r1"), change,
                      lambda boundary, answers: {"iteration": boundary,
                                                 "states": sorted(answers)})


def test_the_latest_boundary_held_is_agreed_with_every_rank():
    server = FakeServer()
    agreement(server, {"change": "snapshot"}).start()
    assert server.asked == [(0, "hold_boundary", {}), (1, "hold_boundary", {})]
    server.reply_from(0, {"ok": True, "result": {"iteration": 4}})
    assert len(server.asked) == 2  # (nothing agreed before every rank held)
    server.reply_from(1, {"ok": True, "result": {"iteration": 5}})
    assert server.asked[2:] == [(0, "agree_boundary", {"iteration": 5, "change": "snapshot"}),
                                (1, "agree_boundary", {"iteration": 5, "change": "snapshot"})]
    server.reply_from(1, {"ok": True, "result": {"iteration": 5}})
    assert server.answer is None
    server.reply_from(0, {"ok": True, "result": {"iteration": 5}})
    assert server.answer == ("reply", {"iteration": 5, "states": [0, 1]})


def test_a_rank_that_cannot_hold_lets_the_others_go_and_the_client_hears_why():
    server = FakeServer()
    agreement(server, {"change": "perturb", "fault": {}}).start()
    server.reply_from(0, {"ok": True, "result": {"iteration": 4}})
    server.reply_from(1, {"ok": False, "error": {"type": "BadArguments",
                                                 "message": "no such rank"}})
    assert server.asked[2:] == [(0, "agree_boundary", {"iteration": 4, "change": "none"})]
    kind, error = server.answer
    assert kind == "fail" and isinstance(error, BadArguments) and error.message == "no such rank"
