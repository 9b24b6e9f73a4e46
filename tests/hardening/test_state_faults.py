"""Faults at the end of a session, driven in process (state machines, fake clock): regression tests."""
from __future__ import annotations

from fedsbdt.client.site import SiteDone
from fedsbdt.server.session import Finished, Finishing

from federation.test_state_machines import Fed, tree_hp


def test_the_coordinator_waits_for_a_site_that_crashed_near_the_end(tmp_path):
    """Regression: the coordinator used to finish as soon as every *connected* site confirmed, and its
    process exits then, so a site that crashed during the last rounds and came back found nobody and
    never got the model.  It now waits for every roster site until deadlines.finish."""
    f = Fed(tmp_path, tree_hp(trees=4)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 3)
    f.fed.crash("hosp-c")
    f.fed.run(until=lambda: isinstance(f.session.stage, Finishing)
              and f.session.sites["hosp-a"].finished_sha256 and f.session.sites["hosp-b"].finished_sha256)
    assert not f.session.done  # still waiting for hosp-c
    m = f.restart_site("hosp-c")  # back within deadlines.finish: it is sent Finished and catches up
    f.fed.run()
    assert isinstance(f.session.stage, Finished) and f.session.exit_code == 0
    assert isinstance(m.stage, SiteDone) and m.stage.model_path.read_bytes() == f.session.model_json
    assert f.session.sites["hosp-c"].finished_sha256 == f.session.stage.model_sha256


def test_the_finish_deadline_bounds_the_wait_for_a_site_that_never_returns(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=3)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 2)
    f.fed.crash("hosp-c")
    f.fed.run(until=lambda: isinstance(f.session.stage, Finishing))
    entered = f.clock.now
    f.fed.run()  # ticks the fake clock while idle
    assert isinstance(f.session.stage, Finished) and f.session.exit_code == 0
    assert entered < f.clock.now <= entered + f.plan.deadlines.finish + 2
    assert f.session.sites["hosp-c"].finished_sha256 is None
