"""The coordinator's live status page and Prometheus metrics (``fedsbdt coordinator --status-port P``).

:class:`CoordinatorMonitor` observes the session *on the gRPC event loop*, right after every session step
(the service calls :meth:`CoordinatorMonitor.after_step`; the ticker makes that at least 20 times a second),
so it reads the session only where the session is changed and never races it.  It keeps

* a snapshot (a plain dict, replaced as a whole, every SNAPSHOT_SECONDS or at once when the session's stage
  changes) that the HTTP thread serves as ``/status.json`` and the page draws;
* the metrics, in a :class:`~prometheus_client.CollectorRegistry` of its own: trees released, failed rounds,
  round latency (a histogram of released rounds, from the step that started a round to the step that
  released it), connected / caught-up / suspended sites, ε spent and planned, the ETA.

ε spent so far is the worst-case record's ε of the releases so far (random trees with the RDP accountant,
:func:`~fedsbdt.common.accountant.epsilon_so_far`), counting a failed round as an accounted round (a
conservative choice: its inputs may have carried data).  For the other tree builders the page shows the
plan's ε as the bound once anything was released (``epsilon.exact`` false).
"""
from __future__ import annotations

import logging
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fedsbdt.common.accountant import epsilon_so_far
from fedsbdt.common.modes import mode_for
from fedsbdt.common.statuspage import page

log = logging.getLogger("fedsbdt.coordinator")

SNAPSHOT_SECONDS = 0.2
#: Tree releases the ETA averages over (the most recent ones).
ETA_WINDOW = 20
ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class CoordinatorMonitor:
    """The session's state for the status page and ``/metrics``; :meth:`after_step` runs on the event loop."""

    def __init__(self, session, clock=time.monotonic, wall=time.time, tuning: dict | None = None) -> None:
        self.session = session
        self.tuning = tuning  # {"trial": i, "trials": K} for a trial of a tuning plan
        self.plan = session.plan
        self.cal = session.cal
        self.clock, self.wall = clock, wall
        self.started = clock()
        self.mode = mode_for(self.plan)
        self.exact_epsilon = self.mode.uniform_tree_rounds and self.cal.accountant == "rdp"
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.m_trees = Counter("fedsbdt_trees_released", "Trees released (restored from the checkpoint included)",
                               registry=r)
        self.m_trees_planned = Gauge("fedsbdt_trees_planned", "Trees the plan releases", registry=r)
        self.m_failed = Counter("fedsbdt_failed_rounds", "Rounds that failed (and were retried)", registry=r)
        self.m_round = Histogram("fedsbdt_round_seconds", "Seconds from a round's start to its release",
                                 buckets=ROUND_BUCKETS, registry=r)
        self.m_sites = Gauge("fedsbdt_sites_connected", "Roster sites with an open event stream", registry=r)
        self.m_joined = Gauge("fedsbdt_sites_joined", "Roster sites that joined this session", registry=r)
        self.m_caught_up = Gauge("fedsbdt_sites_caught_up", "Joined sites holding every released tree", registry=r)
        self.m_suspended = Gauge("fedsbdt_sites_suspended", "Sites suspended until a new epoch", registry=r)
        self.m_roster = Gauge("fedsbdt_sites_roster", "Sites in the plan's roster", registry=r)
        self.m_eps = Gauge("fedsbdt_epsilon_spent", "ε of the releases so far (worst-case record)", registry=r)
        self.m_eps_plan = Gauge("fedsbdt_epsilon_planned", "ε of the whole plan", registry=r)
        self.m_eta = Gauge("fedsbdt_eta_seconds", "Estimated seconds until every tree is released (NaN: unknown)",
                           registry=r)
        self.m_trees_planned.set(session.total_trees)
        self.m_roster.set(len(session.sites))
        self.m_eps_plan.set(self.cal.epsilon)
        self._trees = len(session.trees)
        self.m_trees.inc(self._trees)
        self._failed = session.rounds_failed
        self.m_failed.inc(self._failed)
        self._round: tuple[int, str, float] | None = None  # (round id, work, started)
        self._last_round_seconds: float | None = None
        self._releases: deque[float] = deque(maxlen=ETA_WINDOW + 1)  # clock() of recent tree releases
        self._last_seen: dict[str, float] = {}
        self._stage = None
        self._snapshot_at = -1.0
        self._eps_cache: tuple[tuple, float] | None = None
        self.snapshot: dict = {}
        self._broken = False
        self._observe()

    # ------------------------------------------------------------------ on the event loop

    def after_step(self) -> None:
        """Observe the session after a step (on the event loop); an error here is logged, never raised into
        the service."""
        try:
            self._observe()
        except Exception:
            if not self._broken:
                self._broken = True
                log.exception("the status page stopped updating", extra={"event": "status_error"})

    def _observe(self) -> None:
        """The counters and the latency histogram at once (cheap); a new snapshot every SNAPSHOT_SECONDS (its
        cost grows with the roster: about a millisecond for 100 sites) or when the stage changes."""
        s, now = self.session, self.clock()
        changed = False
        ph = s.phase
        rnd = getattr(ph, "rnd", None)
        rid = None if rnd is None else rnd.round_id
        if (self._round[0] if self._round else None) != rid:
            failed = s.rounds_failed - self._failed
            if self._round is not None and failed == 0:  # released (a failed round counts below)
                self._last_round_seconds = now - self._round[2]
                self.m_round.observe(self._last_round_seconds)
            self._round = None if rnd is None else (rid, str(ph.work), now)
        if s.rounds_failed != self._failed:
            self.m_failed.inc(s.rounds_failed - self._failed)
            self._failed = s.rounds_failed
        if len(s.trees) != self._trees:
            k = len(s.trees) - self._trees
            self.m_trees.inc(max(k, 0))
            self._releases.extend([now] * max(k, 0))
            self._trees = len(s.trees)
        if s.stage is not self._stage:
            self._stage = s.stage
            changed = True
        if changed or now - self._snapshot_at >= SNAPSHOT_SECONDS:
            self._take_snapshot(now)

    def _take_snapshot(self, now: float) -> None:
        s = self.session
        st = s.status()
        epoch = min(s.coord.ready_epochs(), default=None)
        sites, connected, joined, caught, suspended = [], 0, 0, 0, 0
        wall = self.wall()
        for row in st["sites"]:
            ss = s.sites[row["site_id"]]
            if ss.connected:
                self._last_seen[ss.site_id] = wall
            is_joined = ss.joins > 0
            confirmed = ss.finished_sha256 is not None  # it verified the whole model: it holds every tree
            # connected and holding every tree released before it joined: it receives each later one with its
            # round (the session's own test; the site reports its tree count only when it joins)
            current = ss.connected and ss.caught_up()
            is_caught = is_joined and (confirmed or current or ss.trees_applied >= len(s.trees))
            is_susp = ss.suspended_from_epoch is not None and (epoch is None or epoch < ss.suspended_from_epoch)
            connected += ss.connected
            joined += is_joined
            caught += is_caught
            suspended += is_susp
            seen = self._last_seen.get(ss.site_id)
            sites.append({"site_id": ss.site_id, "joined": is_joined, "connected": ss.connected,
                          "caught_up": is_caught, "suspended": is_susp, "eligible": row["eligible"],
                          "trees_applied": len(s.trees) if confirmed or current else ss.trees_applied,
                          "joins": ss.joins,
                          "note": ss.note, "confirmed_model": confirmed,
                          "last_seen": seen, "last_seen_seconds_ago": None if seen is None else round(wall - seen, 3)})
        spent = self._epsilon_spent()
        eta = self._eta(now)
        self.m_sites.set(connected)
        self.m_joined.set(joined)
        self.m_caught_up.set(caught)
        self.m_suspended.set(suspended)
        self.m_eps.set(spent)
        self.m_eta.set(float("nan") if eta is None else eta)
        rnd = None
        if self._round is not None:
            rnd = {"round_id": self._round[0], "work": self._round[1], "phase": s.phase.name,
                   "seconds": round(now - self._round[2], 3)}
        hist = self._histogram()
        self.snapshot = {
            "role": "coordinator", "plan_sha256": self.plan.sha256, "session_id": self.plan.session_id,
            "stage": st["stage"], "detail": st["detail"], "noise": self.plan.noise,
            "mode": self.mode.name,
            "trees_released": len(s.trees), "trees_total": s.total_trees, "current_tree": min(len(s.trees) + 1,
                                                                                             s.total_trees),
            "round": rnd, "rounds_failed": s.rounds_failed, "threshold": self.plan.threshold,
            "round_seconds": {"last": _r(self._last_round_seconds), "count": hist[0],
                              "mean": _r(hist[1] / hist[0]) if hist[0] else None},
            "epsilon": {"spent": spent, "planned": self.cal.epsilon, "delta": self.cal.delta,
                        "exact": self.exact_epsilon, "eval": self.plan.eval_epsilon,
                        "total": self.plan.total_epsilon},
            "eta_seconds": _r(eta), "model_sha256": st["model_sha256"], "sites": sites,
            "uptime_seconds": round(now - self.started, 3), "time": wall, "tuning": self.tuning,
        }
        self._snapshot_at = now

    def _histogram(self) -> tuple[int, float]:
        """(count, sum) of the round-latency histogram."""
        count = total = 0.0
        for metric in self.m_round.collect():
            for smp in metric.samples:
                if smp.name.endswith("_count"):
                    count = smp.value
                elif smp.name.endswith("_sum"):
                    total = smp.value
        return int(count), total

    def _epsilon_spent(self) -> float:
        s = self.session
        rounds = len(s.trees) + s.rounds_failed
        key = (rounds, bool(s.has_init and s.init is not None and s.init.round_id is not None))
        if self._eps_cache is None or self._eps_cache[0] != key:
            if self.exact_epsilon:
                value = epsilon_so_far(self.cal, key[0], key[1], self.plan.hyperparameters.epsilon)
            else:  # the plan's ε bounds every release; per-round accounting of this builder is not shown
                value = self.cal.epsilon if (key[0] or key[1]) else 0.0
            self._eps_cache = (key, min(value, self.cal.epsilon))
        return self._eps_cache[1]

    def _eta(self, now: float) -> float | None:
        """Seconds until the last tree, from the mean interval of the recent releases (None: too early)."""
        left = self.session.total_trees - len(self.session.trees)
        if left <= 0:
            return 0.0
        if len(self._releases) < 2:
            return None
        per_tree = (self._releases[-1] - self._releases[0]) / (len(self._releases) - 1)
        return per_tree * left - min(now - self._releases[-1], per_tree)  # a stalled round never counts down to 0

    def current(self) -> dict:
        """The latest snapshot (read by the HTTP thread; replaced as a whole, never changed in place)."""
        return self.snapshot


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


COORDINATOR_PAGE = page("fedsbdt coordinator", """
<h1>fedsbdt coordinator</h1>
<div class="sub">session <b id="session">—</b> · plan <code id="plan">—</code><span id="tuning"></span> · stage
 <b id="stage">—</b> · <span id="detail"></span></div>
<h2>Progress</h2>
<div class="grid">
 <div class="card"><div class="k">trees released</div><div class="v"><span id="trees">—</span> / <span id="total">—</span></div>
  <div class="bar"><div id="treebar" style="width:0"></div></div></div>
 <div class="card"><div class="k">current round</div><div class="v" id="round">—</div><div class="sub" id="roundwork"></div></div>
 <div class="card"><div class="k">ε spent / planned</div><div class="v"><span id="eps">—</span> / <span id="epsplan">—</span></div>
  <div class="bar"><div id="epsbar" style="width:0"></div></div><div class="sub" id="epsnote"></div></div>
 <div class="card"><div class="k">round latency (last · mean)</div><div class="v"><span id="lat">—</span></div><div class="sub" id="latmean"></div></div>
 <div class="card"><div class="k">failed rounds</div><div class="v" id="failed">—</div></div>
 <div class="card"><div class="k">ETA</div><div class="v" id="eta">—</div></div>
</div>
<h2>Sites (<span id="nconn">—</span> connected of <span id="nsites">—</span>, threshold <span id="t">—</span>)</h2>
<table><thead><tr><th>site</th><th>joined</th><th>connected</th><th>caught up</th><th>trees</th><th>suspended</th>
<th>last seen</th><th>note</th></tr></thead><tbody id="sites"></tbody></table>
""", """
function yes(b,good){return {text:b?"yes":"no",cls:b?(good?"ok":"warn"):(good?"warn":"")};}
function render(s){
  setText("session",s.session_id);setText("plan",s.plan_sha256.slice(0,16)+"…");setText("stage",s.stage);
  setText("tuning",s.tuning?" · tuning trial "+s.tuning.trial+" of "+s.tuning.trials:"");
  setText("detail",s.detail);setText("trees",s.trees_released);setText("total",s.trees_total);
  bar("treebar",s.trees_total?s.trees_released/s.trees_total:0);
  setText("round",s.round?("#"+s.round.round_id):"—");
  setText("roundwork",s.round?(s.round.work+" · "+s.round.phase+" · "+dur(s.round.seconds)):"between rounds");
  setText("eps",num(s.epsilon.spent,4));setText("epsplan",num(s.epsilon.planned,4));
  bar("epsbar",s.epsilon.planned?s.epsilon.spent/s.epsilon.planned:0);
  setText("epsnote",(s.epsilon.exact?"worst-case record, δ = ":"bound: the plan's ε, δ = ")+s.epsilon.delta+
    (s.epsilon.eval===null?"":" · plus ε_eval "+s.epsilon.eval+" of the held-out records: "+num(s.epsilon.total,4)+
     " in total"));
  setText("lat",s.round_seconds.last===null?"—":dur(s.round_seconds.last));
  setText("latmean",s.round_seconds.mean===null?"":"mean "+dur(s.round_seconds.mean)+" over "+s.round_seconds.count+" rounds");
  setText("failed",s.rounds_failed);$("failed").className="v"+(s.rounds_failed?" warn":"");
  setText("eta",s.trees_released>=s.trees_total?"done":(s.eta_seconds===null?"—":dur(s.eta_seconds)));
  setText("nconn",s.sites.filter(function(x){return x.connected;}).length);setText("nsites",s.sites.length);
  setText("t",s.threshold);
  rows("sites",s.sites,function(x){return [x.site_id,yes(x.joined,true),yes(x.connected,true),
    yes(x.caught_up,true),x.trees_applied,{text:x.suspended?"yes":"no",cls:x.suspended?"bad":""},
    x.connected?"now":(x.last_seen_seconds_ago===null?"never":dur(x.last_seen_seconds_ago)+" ago"),x.note||""];});
}
""")
