"""What the coordinator keeps does not grow with the number of rounds (in process, 3 sites, many epochs).

Everything reachable from the Session and the service's outboxes is measured after each release, except
the released model itself (the trees) and the plan; over 30 trees and 8 epochs of 4 round slots it must
level off: a used-up epoch's routed shares, its public material and old outbox events are let go.
"""
from __future__ import annotations

import gc
import sys
import types

from fedsbdt.server import outbox as ob
from fedsbdt.server.service import FederationService

from .test_state_machines import SITES, Fed, tree_hp

_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType)


def retained(roots, skip) -> int:
    """Bytes of every object reachable from ``roots`` (sys.getsizeof), not entering ``skip``."""
    seen, stack, total = {id(o) for o in skip}, list(roots), 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _SKIP):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        stack.extend(gc.get_referents(o))
    return total


def test_coordinator_state_does_not_grow_with_rounds(tmp_path, monkeypatch):
    monkeypatch.setattr(ob, "OUTBOX_EVENTS", 24)
    f = Fed(tmp_path, tree_hp(trees=30, depth=2), epoch_rounds=4)
    svc = FederationService(f.session, tls=False)
    svc.outboxes = {s: ob.Outbox(s.encode()) for s in SITES}
    deliver = f.fed.deliver

    def both(outs):
        svc.dispatch(outs)
        deliver(outs)

    f.fed.deliver = both
    samples: list[tuple[int, int, int]] = []  # (trees, bytes retained, routed epochs)
    release = f.session._release

    def measured(*a, **k):
        out = release(*a, **k)
        s = f.session
        samples.append((len(s.trees), retained([s, svc], [s.trees, s.plan, s.levels, s.init, s.cal]),
                        len(s._routed)))
        return out

    f.session._release = measured
    f.start().fed.run()
    assert f.session.exit_code == 0 and f.session.next_epoch_id >= 8
    assert max(r for _, _, r in samples) <= 2  # routed shares of the ready epochs only
    early = max(b for t, b, _ in samples if 8 <= t <= 16)
    late = max(b for t, b, _ in samples if t >= 22)
    assert late <= early * 1.05, samples
