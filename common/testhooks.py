"""TEST-ONLY fault injection: a process SIGKILLs itself when it reaches a named protocol stage.

Off unless the environment variable ``FEDSBDT_TEST_KILL_AT`` is set; nothing
here runs in a normal deployment (every hook returns after one comparison).
The hardening tests (``tests/hardening/``) and ``benchmarks/soak.py`` use it
to kill the coordinator and the sites at *deterministic* points of the
protocol instead of at random times::

    FEDSBDT_TEST_KILL_AT="masked_input@5"          # first masked input at tree ≥ 5, before it is sent
    FEDSBDT_TEST_KILL_AT="unmask@3:after"          # after the unmask reply for a tree ≥ 3 was accepted
    FEDSBDT_TEST_KILL_AT="epoch_setup@0,tree_release@7"   # whichever comes first

A kill point ``stage@r[:when]`` fires the first time the process reaches
``stage`` while it works on tree ``r`` or a later one (the initial-score
round counts as tree 0; ``tree_release@r`` means "tree r or a later one was
just released").  ``when`` is ``before`` (default: the reply is computed and
durably committed but not yet sent; at the coordinator: the step committed
but its events were not yet delivered) or ``after`` (the reply was sent and
accepted; at the coordinator: the events were queued for delivery).

Stages, with where each one fires:

==============  =====================================  ==========================================
stage           site (client/daemon.py)                coordinator (server/service.py)
==============  =====================================  ==========================================
epoch_setup     sending AdvertiseKeys / ShareKeys      queuing an EpochAnnounce/Roster/Shares
init_round      sending the initial-score input        queuing the initial-score RoundStart
                                                       (after: queuing the released score)
masked_input    sending a tree's masked input          queuing a tree's RoundStart (after: a
                                                       masked input was accepted)
consistency     sending a ConsistencySignature         queuing a ConsistencyRequest
unmask          sending an UnmaskResponse              queuing an UnmaskRequest
tree_release    a released tree was applied            a tree is committed, not yet broadcast
==============  =====================================  ==========================================

Before dying the process writes one line ``fedsbdt-testhook: SIGKILL at <point> (tree <r>)``
to stderr, so a test can check that the kill point was really reached.
Setting ``FEDSBDT_TEST_FAULTHANDLER=1`` makes SIGUSR1 dump every thread's
stack to stderr (diagnosing a hung process in a test).
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

ENV = "FEDSBDT_TEST_KILL_AT"
STAGES = ("epoch_setup", "init_round", "masked_input", "consistency", "unmask", "tree_release")
WHEN = ("before", "after")


@dataclass(frozen=True)
class KillPoint:
    stage: str
    tree: int
    when: str = "before"

    def __str__(self) -> str:
        return f"{self.stage}@{self.tree}:{self.when}"


def parse(text: str | None) -> tuple[KillPoint, ...]:
    """``"stage@r[:when],..."`` → kill points; raises ValueError on anything else (a typo must not pass)."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        part = part.strip()
        stage, _, rest = part.partition("@")
        tree, _, when = rest.partition(":")
        when = when or "before"
        if stage not in STAGES or when not in WHEN or not tree.isdigit():
            raise ValueError(f"{ENV}: bad kill point {part!r} (expected stage@tree[:before|after], "
                             f"stage one of {', '.join(STAGES)})")
        out.append(KillPoint(stage, int(tree), when))
    return tuple(out)


POINTS: tuple[KillPoint, ...] = parse(os.environ.get(ENV))
ACTIVE = bool(POINTS)

if os.environ.get("FEDSBDT_TEST_FAULTHANDLER"):
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)


def reached(stage: str, tree: int, when: str = "before") -> None:
    """Die here (SIGKILL) if a kill point matches; a no-op unless ``FEDSBDT_TEST_KILL_AT`` is set."""
    if not ACTIVE:
        return
    for p in POINTS:
        if p.stage == stage and p.when == when and tree >= p.tree:
            try:
                sys.stderr.write(f"fedsbdt-testhook: SIGKILL at {p} (tree {tree})\n")
                sys.stderr.flush()
            finally:
                os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------- classification helpers


def _secagg_kind(data: bytes) -> str | None:
    from fedsbdt.common.secagg import decode_message
    from fedsbdt.common.secagg.errors import InvalidMessage

    try:
        return type(decode_message(bytes(data))).__name__
    except InvalidMessage:
        return None


_SITE_REPLY = {"ConsistencySignature": "consistency", "UnmaskResponse": "unmask"}
_COORD_ROUND = {"ConsistencyRequest": "consistency", "UnmaskRequest": "unmask"}


def site_reply(reply, trees_applied: int, when: str) -> None:
    """Site: a reply (fedsbdt.common.federation.wire.*Reply) is about to be sent (``before``) or was accepted (``after``)."""
    if not ACTIVE:
        return
    from fedsbdt.common.federation.wire import InputReply, Purpose, RoundReply, SetupReply

    if isinstance(reply, SetupReply):
        reached("epoch_setup", trees_applied, when)
    elif isinstance(reply, InputReply):
        if reply.purpose == Purpose.INIT_SCORE:
            reached("init_round", 0, when)
        else:
            reached("masked_input", int(reply.tree), when)
    elif isinstance(reply, RoundReply):
        stage = _SITE_REPLY.get(_secagg_kind(reply.secagg) or "")
        if stage is not None:
            reached(stage, trees_applied, when)


def site_event(event) -> None:
    """Site: an event was handled (a released tree applied)."""
    if not ACTIVE:
        return
    from fedsbdt.common.federation.wire import TreeMsg

    if isinstance(event, TreeMsg):
        reached("tree_release", int(event.index), "before")
        reached("tree_release", int(event.index), "after")


def coordinator_dispatch(outs, trees_released: int, when: str) -> None:
    """Coordinator: the session committed a step whose events are about to be (or were just) queued."""
    if not ACTIVE:
        return
    from fedsbdt.common.federation.wire import InitScoreMsg, Purpose, RoundMsg, RoundStartMsg, SetupMsg, TreeMsg

    seen = set()
    for _, ev in outs:
        if id(ev) in seen:
            continue
        seen.add(id(ev))
        if isinstance(ev, SetupMsg):
            reached("epoch_setup", trees_released, when)
        elif isinstance(ev, RoundStartMsg):
            if when == "before":  # masked_input:after fires when an input is accepted (coordinator_input)
                reached("init_round" if ev.purpose == Purpose.INIT_SCORE else "masked_input",
                        0 if ev.purpose == Purpose.INIT_SCORE else int(ev.tree), when)
        elif isinstance(ev, RoundMsg):
            stage = _COORD_ROUND.get(_secagg_kind(ev.secagg) or "")
            if stage is not None:
                reached(stage, trees_released, when)
        elif isinstance(ev, TreeMsg):
            reached("tree_release", int(ev.index), when)
        elif isinstance(ev, InitScoreMsg) and when == "after":
            reached("init_round", 0, "after")


def coordinator_input(tree: int) -> None:
    """Coordinator: a masked input for ``tree`` was accepted (kill point ``masked_input@r:after``)."""
    if ACTIVE:
        reached("masked_input", tree, "after")
