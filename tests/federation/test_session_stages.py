"""The coordinator session's stages (server/session.py, server/epochs.py, server/rounds.py): every transition
the driver takes is one the diagrams allow, a whole run walks the slow round's stages in order, and a message
that the current stage does not expect is refused naming that stage."""
from __future__ import annotations

import pytest

from fedsbdt.common.federation.wire import Purpose
from fedsbdt.server import epochs, rounds, session as sess
from fedsbdt.server.session import Rejected, Session

from .test_state_machines import Fed, tree_hp

ALLOWED = {
    "session": {("Gathering", "Running"), ("Running", "Running"), ("Running", "Finishing"), ("Running", "Failed"),
                ("Finishing", "Finished")},
    "epochs": {("NoSetup", "Advertising"), ("Advertising", "Sharing"), ("Advertising", "NoSetup"),
               ("Sharing", "NoSetup")},
    "rounds": {("Between", "Between"), ("Between", "CollectingInputs"), ("CollectingInputs", "CollectingSignatures"),
               ("CollectingInputs", "Between"), ("CollectingSignatures", "CollectingShares"),
               ("CollectingSignatures", "Between"), ("CollectingShares", "Between")},
}


class RecordingSession(Session):
    """The session, recording each transition its driver takes (the stages are the real ones)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.seen: dict[str, list[tuple[str, str]]] = {k: [] for k in ALLOWED}

    def _state(self) -> dict[str, str]:
        return {"session": type(self.stage).__name__, "epochs": type(self.pipeline).__name__,
                "rounds": type(self.phase).__name__}

    def _step(self, now, out) -> bool:
        before = self._state()
        moved = super()._step(now, out)
        after = self._state()
        for k in ALLOWED:
            if moved and (before[k] != after[k] or k == "session"):
                self.seen[k].append((before[k], after[k]))
        return moved


def recording_fed(tmp_path, **plan) -> Fed:
    f = Fed(tmp_path, tree_hp(trees=3), **plan)
    f.session = f.fed.session = RecordingSession(f.plan, f.plan.make_randomness(True), f.clock.now)
    return f


def test_every_transition_is_one_the_stage_diagrams_allow(tmp_path):
    f = recording_fed(tmp_path, secagg_fast_path="never").start()
    f.fed.run()
    s = f.session
    assert s.exit_code == 0, s.stage
    for k, pairs in s.seen.items():
        assert set(pairs) <= ALLOWED[k], (k, set(pairs) - ALLOWED[k])
    walk = [b for b, _ in s.seen["rounds"] if b != "Between"]
    assert walk[:3] == ["CollectingInputs", "CollectingSignatures", "CollectingShares"]
    assert len(walk) == 3 * (1 + 3)  # the initial score and three trees, each through the three stages
    assert s.seen["session"][0] == ("Gathering", "Running") and s.seen["session"][-1] == ("Finishing", "Finished")
    assert ("Sharing", "NoSetup") in s.seen["epochs"]


def test_a_fast_round_closes_its_inputs_straight_into_the_release(tmp_path):
    f = recording_fed(tmp_path, secagg_fast_path="always").start()
    f.fed.run()
    s = f.session
    assert s.exit_code == 0, s.stage
    assert {b for b, _ in s.seen["rounds"]} == {"Between", "CollectingInputs"}
    assert ("CollectingInputs", "Between") in s.seen["rounds"]


def test_a_message_the_stage_does_not_expect_is_refused_naming_the_stage(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=2)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    s, now = f.session, f.clock.now
    ph, pipe = s.phase, s.pipeline
    assert isinstance(pipe, epochs.NoSetup)
    probe = type("Probe", (), {"epoch": 7})()
    with pytest.raises(Rejected, match=r"Probe for epoch 7 is not expected now \(epoch setup stage: idle\)"):
        pipe.receive(s, probe)
    if not isinstance(ph, rounds.CollectingInputs):
        with pytest.raises(Rejected, match=r"no round for tree 1 is collecting inputs now"):
            ph.receive_input(s, probe, sess.Work(Purpose.TREE, 1))
    if not isinstance(ph, (rounds.CollectingSignatures, rounds.CollectingShares)):
        with pytest.raises(Rejected, match="no round is collecting Probe now"):
            ph.receive_round(s, probe)
    assert s.phase is ph and s.pipeline is pipe  # refused: nothing changed
    f.fed.run()
    assert s.exit_code == 0
