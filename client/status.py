"""A site's own live status page and Prometheus metrics (``fedsbdt client --status-port P``).

The page shows this site's side of the session: the plan it accepted, the trees it applied, the rounds it
answered (masked inputs sent) and refused, and its per-record privacy ledger — the ε spent by its records
(quantiles and the maximum) against the plan's ε and the site's own ``--max-epsilon``.

It reads only durable, committed state: the site database through a read-only SQLite connection of its
own (WAL: readers never block the site's writes), and refusals from the site's structured log events
(``refused``, a warning: ``--log-level error`` hides them from the count too).  A record's ε is Cor. 6 at the filter's order α̂ of its Rényi ledger (plus the initial
score's RDP once the site sent it); without the filter every record is charged the worst case, the ε of
the tree rounds this site sent data in (random trees with the RDP accountant; other builders show the
plan's ε as the bound).  These numbers are the site's own and stay on its page: bind it to loopback
(the default) or to a network only the site's operators reach.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fedsbdt.common.accountant import epsilon_so_far, init_score_rdp, record_epsilon
from fedsbdt.common.modes import mode_for
from fedsbdt.common.rdp_filter import UNITS_PER_ROUND
from fedsbdt.common.statuspage import page

from .ledger import ledger_path

log = logging.getLogger("fedsbdt.site")

CACHE_SECONDS = 0.5
QUANTILES = (0.5, 0.9, 0.99)


class RefusalCounter(logging.Handler):
    """Counts this site's ``refused`` log events (every Refusal the daemon reports to the coordinator)."""

    def __init__(self, site_id: str) -> None:
        super().__init__(logging.INFO)
        self.site_id = site_id
        self.count = 0
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "refused" and getattr(record, "site", None) == self.site_id:
            self.count += 1
            self.last = record.getMessage()[:300]


class SiteMonitor:
    """Snapshots of one site (machine: :class:`~fedsbdt.client.site.SiteMachine`) for the page and /metrics."""

    def __init__(self, machine, max_epsilon: float | None, clock=time.monotonic, tuning: dict | None = None) -> None:
        self.m = machine
        self.tuning = tuning  # {"trial": i, "trials": K} for a trial of a tuning plan
        self.max_epsilon = max_epsilon
        self.clock = clock
        self.started = clock()
        self.refusals = RefusalCounter(machine.site_id)
        logging.getLogger("fedsbdt.site").addHandler(self.refusals)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._cached: tuple[float, dict] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def follow(self, machine, tuning: dict | None) -> None:
        """Show ``machine`` from now on: the next trial of a tuning plan (its own plan, ledger file and session)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self.m, self.tuning, self._cached = machine, tuning, None

    def close(self) -> None:
        logging.getLogger("fedsbdt.site").removeHandler(self.refusals)
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def current(self) -> dict:
        """The snapshot (at most CACHE_SECONDS old); called from the HTTP server's threads."""
        with self._lock:
            now = self.clock()
            if self._cached is None or now - self._cached[0] >= CACHE_SECONDS:
                self._cached = (now, self._snapshot(now))
            return self._cached[1]

    def _connection(self, plan) -> sqlite3.Connection | None:
        if self._db is None:
            path = ledger_path(self.m.state_dir, plan.sha256)
            if not path.exists():
                return None
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        return self._db

    def _snapshot(self, now: float) -> dict:
        m = self.m
        plan = m.plan  # set last by accept_plan: cal, table and the ledger exist once it is
        out = {"role": "site", "site_id": m.site_id, "stage": m.stage.name, "uptime_seconds": round(now - self.started, 3),
               "time": time.time(), "refusals": self.refusals.count, "last_refusal": self.refusals.last,
               "max_epsilon": self.max_epsilon, "plan_sha256": None, "trees_applied": m.trees_applied,
               "tuning": self.tuning}
        if plan is None:
            return out | {"trees_total": None, "rounds_answered": 0, "tree_rounds_with_data": 0,
                          "epsilon": None}
        hp, cal = plan.hyperparameters, m.cal
        db = self._connection(plan)
        spent = np.zeros(0, np.int64)
        answered = tree_rounds = init_sent = 0
        if db is not None:
            spent = np.fromiter((r[0] for r in db.execute("SELECT spent FROM ledger")), np.int64)
            answered = db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0]
            tree_rounds = db.execute(
                "SELECT COUNT(*) FROM contributions WHERE kind = 'tree' AND with_data = 1").fetchone()[0]
            init_sent = db.execute("SELECT COUNT(*) FROM contributions WHERE kind = 'init'").fetchone()[0]
        eps = self._record_epsilon(plan, spent, tree_rounds, init_sent > 0)
        q = {f"p{int(p * 100)}": float(np.quantile(eps, p)) for p in QUANTILES} if eps.size else {}
        return out | {
            "plan_sha256": plan.sha256, "session_id": plan.session_id, "trees_total": hp.total_rounds,
            "noise": plan.noise, "mode": mode_for(plan).name, "filter": bool(hp.filter),
            "rounds_answered": int(answered), "tree_rounds_with_data": int(tree_rounds),
            "epsilon": {"planned": cal.epsilon, "delta": cal.delta, "records": int(eps.size),
                        "eval": plan.eval_epsilon, "total": plan.total_epsilon,
                        "max": float(eps.max()) if eps.size else 0.0, **q,
                        "exhausted": int(np.sum(spent > m.table.budget_units - UNITS_PER_ROUND))
                        if m.table is not None and spent.size else 0,
                        "per_record": m.table is not None, "exact": m.table is not None or self._exact(plan)},
        }

    @staticmethod
    def _exact(plan) -> bool:
        return mode_for(plan).uniform_tree_rounds and plan.calibration().accountant == "rdp"

    def _record_epsilon(self, plan, spent: np.ndarray, tree_rounds: int, init_sent: bool) -> np.ndarray:
        """Each record's ε (see the module docstring)."""
        m, cal = self.m, self.m.cal
        init = bool(init_sent and cal.eps_init > 0)
        if m.table is not None:  # the per-record Rényi filter: the ledger's units at α̂
            rdp = m.table.units_to_rdp(spent) + (init_score_rdp(cal.alpha, cal.eps_init, cal.eps_ds) if init else 0.0)
            return record_epsilon(rdp, cal.alpha, cal.delta)
        if self._exact(plan):
            worst = epsilon_so_far(cal, tree_rounds, init, plan.hyperparameters.epsilon)
        else:
            worst = cal.epsilon if (tree_rounds or init) else 0.0
        return np.full(spent.size, worst)


class _Collector:
    """The site's metrics, computed from the current snapshot at each scrape."""

    def __init__(self, monitor: SiteMonitor) -> None:
        self.monitor = monitor

    def collect(self):
        s = self.monitor.current()
        yield _gauge("fedsbdt_site_trees_applied", "Released trees this site applied", s["trees_applied"])
        c = CounterMetricFamily("fedsbdt_site_rounds_answered", "Masked inputs this site sent (every round kind)")
        c.add_metric([], s["rounds_answered"])
        yield c
        c = CounterMetricFamily("fedsbdt_site_refusals", "Requests this site refused (reported to the coordinator)")
        c.add_metric([], s["refusals"])
        yield c
        eps = s["epsilon"]
        if eps is None:
            return
        yield _gauge("fedsbdt_site_records", "Records in this site's ledger", eps["records"])
        yield _gauge("fedsbdt_site_epsilon_max", "Largest ε any record of this site spent", eps["max"])
        yield _gauge("fedsbdt_site_epsilon_planned", "ε of the whole plan", eps["planned"])
        if s["max_epsilon"] is not None:
            yield _gauge("fedsbdt_site_epsilon_limit", "This site's --max-epsilon", s["max_epsilon"])
        g = GaugeMetricFamily("fedsbdt_site_epsilon_spent", "ε spent by this site's records, by quantile",
                              labels=["quantile"])
        for p in QUANTILES:
            key = f"p{int(p * 100)}"
            if key in eps:
                g.add_metric([str(p)], eps[key])
        g.add_metric(["1"], eps["max"])
        yield g


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


class SitePage:
    """``--status-port``: the site's page, on one port for the whole process (every trial of a tuning plan)."""

    def __init__(self, server, max_epsilon: float | None) -> None:
        self.server, self.max_epsilon = server, max_epsilon
        self.monitor: SiteMonitor | None = None

    def show(self, machine, tuning: dict | None = None) -> None:
        """Serve ``machine``'s state from now on (the first call starts serving)."""
        if self.monitor is None:
            self.monitor = SiteMonitor(machine, self.max_epsilon, tuning=tuning)
            self.server.start(self.monitor.current, self.monitor.registry)
        else:
            self.monitor.follow(machine, tuning)


def bind_page(args) -> SitePage | None:
    """``--status-port``: the site's page, bound (StatusPageError if the port is taken), not yet serving; or None."""
    from fedsbdt.common.statuspage import bind

    server = bind(args, SITE_PAGE, "site's status page")
    return None if server is None else SitePage(server, args.max_epsilon)


SITE_PAGE = page("fedsbdt site", """
<h1>fedsbdt site <span id="site">—</span></h1>
<div class="sub">stage <b id="stage">—</b> · plan <code id="plan">—</code><span id="tuning"></span> · noise
 <span id="noise">—</span></div>
<h2>This site</h2>
<div class="grid">
 <div class="card"><div class="k">trees applied</div><div class="v"><span id="trees">—</span> / <span id="total">—</span></div>
  <div class="bar"><div id="treebar" style="width:0"></div></div></div>
 <div class="card"><div class="k">rounds answered</div><div class="v" id="answered">—</div>
  <div class="sub"><span id="treerounds">—</span> tree rounds with data</div></div>
 <div class="card"><div class="k">refusals</div><div class="v" id="refusals">—</div><div class="sub" id="lastref"></div></div>
</div>
<h2>Privacy ledger (<span id="records">—</span> records)</h2>
<div class="grid">
 <div class="card"><div class="k">ε spent: max / plan</div><div class="v"><span id="epsmax">—</span> / <span id="epsplan">—</span></div>
  <div class="bar"><div id="epsbar" style="width:0"></div></div><div class="sub" id="limit"></div></div>
 <div class="card"><div class="k">median · 90 % · 99 % of records</div><div class="v"><span id="p50">—</span> · <span id="p90">—</span> · <span id="p99">—</span></div>
  <div class="sub" id="epsnote"></div></div>
 <div class="card"><div class="k">records out of budget</div><div class="v" id="exhausted">—</div></div>
</div>
""", """
function render(s){
  setText("site",s.site_id);setText("stage",s.stage);setText("plan",s.plan_sha256?s.plan_sha256.slice(0,16)+"…":"not yet accepted");
  setText("tuning",s.tuning?" · tuning trial "+s.tuning.trial+" of "+s.tuning.trials:"");
  setText("noise",s.noise);setText("trees",s.trees_applied);setText("total",s.trees_total);
  bar("treebar",s.trees_total?s.trees_applied/s.trees_total:0);
  setText("answered",s.rounds_answered);setText("treerounds",s.tree_rounds_with_data);
  setText("refusals",s.refusals);$("refusals").className="v"+(s.refusals?" warn":"");setText("lastref",s.last_refusal||"");
  var e=s.epsilon;if(!e)return;
  setText("records",e.records);setText("epsmax",num(e.max,4));setText("epsplan",num(e.planned,4));
  bar("epsbar",e.planned?e.max/e.planned:0);
  setText("limit",(s.max_epsilon===null?"no --max-epsilon":"this site's --max-epsilon "+s.max_epsilon)+
    (e.eval===null?"":" · the plan's total with ε_eval "+e.eval+" of the held-out records: "+num(e.total,4)));
  setText("p50",num(e.p50,4));setText("p90",num(e.p90,4));setText("p99",num(e.p99,4));
  setText("epsnote",(e.per_record?"per-record Rényi filter":"every record charged the worst case")+
    (e.exact?"":" (bound: the plan's ε)")+", δ = "+e.delta);
  setText("exhausted",e.per_record?e.exhausted:"—");
}
""")
