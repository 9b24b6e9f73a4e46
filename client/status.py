"""A site's own live status page and Prometheus metrics (``fedsbdt client --status-port P``).

The page shows this site's side of the session, and by default nothing computed from its records: the plan it
accepted and the plan's public privacy statement (ε, δ), the trees it applied, the rounds it answered (masked
inputs sent), the attempts the coordinator failed against this site's limits (``--max-failed-attempts`` per
round, ``--max-failed-attempts-per-session``) and the requests it refused.  None of these depends on the data.

Its per-record privacy ledger — the record count, the ε spent by its records (quantiles and the maximum), the
records out of budget, the tree rounds that carried data — is computed from the records and is not
differentially private.  It is shown only with ``--status-show-records``, which the client accepts for a
loopback ``--status-host`` alone (:func:`bind_page`); a page beyond loopback needs a token in any case
(common/statuspage.py).

It reads only durable, committed state: the site database through a read-only SQLite connection of its
own (WAL: readers never block the site's writes), and refusals from the site's structured log events
(``refused``, a warning: ``--log-level error`` hides them from the count too).  A record's ε is Cor. 6 at the
filter's order α̂ of its Rényi ledger (plus the initial score's RDP once the site sent it); without the filter
every record is charged the worst case, the ε of the tree rounds this site sent data in (random trees with the
RDP accountant; other builders show the plan's ε as the bound).
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

from .ledger import failed_attempts, ledger_path

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

    def __init__(self, machine, max_epsilon: float | None, clock=time.monotonic, tuning: dict | None = None,
                 show_records: bool = False) -> None:
        self.m = machine
        self.tuning = tuning  # {"trial": i, "trials": K} for a trial of a tuning plan
        self.max_epsilon = max_epsilon
        self.show_records = show_records  # --status-show-records (loopback only): the record statistics too
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
               "tuning": self.tuning, "records": None}
        if plan is None:
            return out | {"trees_total": None, "rounds_answered": 0, "failed_attempts": None, "epsilon": None}
        hp, cal, policy = plan.hyperparameters, m.cal, m.options.policy
        db = self._connection(plan)
        answered = failed = 0
        if db is not None:
            answered = db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0]
            failed = failed_attempts(db)
        out |= {
            "plan_sha256": plan.sha256, "session_id": plan.session_id, "trees_total": hp.total_rounds,
            "noise": plan.noise, "mode": mode_for(plan).name, "filter": bool(hp.filter),
            "rounds_answered": int(answered),  # counts of rounds and attempts: not computed from the records
            "failed_attempts": {"session": int(failed), "limit": policy.session_failure_limit(plan),
                                "per_round_limit": policy.max_failed_attempts},
            "epsilon": {"planned": cal.epsilon, "delta": cal.delta, "eval": plan.eval_epsilon,
                        "total": plan.total_epsilon},  # the plan's public statement
        }
        if self.show_records and db is not None:
            out["records"] = self._records(plan, db)
        return out

    def _records(self, plan, db: sqlite3.Connection) -> dict:
        """``--status-show-records``: statistics of this site's records (not differentially private)."""
        m = self.m
        spent = np.fromiter((r[0] for r in db.execute("SELECT spent FROM ledger")), np.int64)
        tree_rounds = db.execute(
            "SELECT COUNT(*) FROM contributions WHERE kind = 'tree' AND with_data = 1").fetchone()[0]
        init_sent = db.execute("SELECT COUNT(*) FROM contributions WHERE kind = 'init'").fetchone()[0]
        eps = self._record_epsilon(plan, spent, tree_rounds, init_sent > 0)
        q = {f"p{int(p * 100)}": float(np.quantile(eps, p)) for p in QUANTILES} if eps.size else {}
        return {"count": int(eps.size), "max": float(eps.max()) if eps.size else 0.0, **q,
                "exhausted": int(np.sum(spent > m.table.budget_units - UNITS_PER_ROUND))
                if m.table is not None and spent.size else 0,
                "tree_rounds_with_data": int(tree_rounds),
                "per_record": m.table is not None, "exact": m.table is not None or self._exact(plan)}

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
        eps, failed = s["epsilon"], s["failed_attempts"]
        if eps is None:
            return
        c = CounterMetricFamily("fedsbdt_site_failed_attempts",
                                "Attempts this site answered that the coordinator failed, this session")
        c.add_metric([], failed["session"])
        yield c
        yield _gauge("fedsbdt_site_failed_attempts_limit", "This site's --max-failed-attempts-per-session",
                     failed["limit"])
        yield _gauge("fedsbdt_site_epsilon_planned", "ε of the whole plan (its public statement)", eps["planned"])
        if s["max_epsilon"] is not None:
            yield _gauge("fedsbdt_site_epsilon_limit", "This site's --max-epsilon", s["max_epsilon"])
        r = s["records"]
        if r is None:  # without --status-show-records: nothing computed from the records
            return
        yield _gauge("fedsbdt_site_records", "Records in this site's ledger (not DP: --status-show-records)",
                     r["count"])
        yield _gauge("fedsbdt_site_epsilon_max", "Largest ε any record of this site spent", r["max"])
        g = GaugeMetricFamily("fedsbdt_site_epsilon_spent", "ε spent by this site's records, by quantile",
                              labels=["quantile"])
        for p in QUANTILES:
            key = f"p{int(p * 100)}"
            if key in r:
                g.add_metric([str(p)], r[key])
        g.add_metric(["1"], r["max"])
        yield g
        if r["per_record"]:
            yield _gauge("fedsbdt_site_records_out_of_budget", "Records whose individual budget is spent",
                         r["exhausted"])


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


class SitePage:
    """``--status-port``: the site's page, on one port for the whole process (every trial of a tuning plan)."""

    def __init__(self, server, max_epsilon: float | None, show_records: bool = False) -> None:
        self.server, self.max_epsilon, self.show_records = server, max_epsilon, show_records
        self.monitor: SiteMonitor | None = None

    def show(self, machine, tuning: dict | None = None) -> None:
        """Serve ``machine``'s state from now on (the first call starts serving)."""
        if self.monitor is None:
            self.monitor = SiteMonitor(machine, self.max_epsilon, tuning=tuning, show_records=self.show_records)
            self.server.start(self.monitor.current, self.monitor.registry)
        else:
            self.monitor.follow(machine, tuning)


def bind_page(args) -> SitePage | None:
    """``--status-port``: the site's page, bound, not yet serving; or None.  StatusPageError (one sentence) if the
    port is taken, if the page would be served beyond loopback without a token, or if ``--status-show-records``
    asks for the record statistics on anything but a loopback address."""
    from fedsbdt.common.statuspage import StatusPageError, bind, is_loopback

    if args.status_show_records:
        if args.status_port is None:
            raise StatusPageError("--status-show-records shows statistics of this site's records on its status page: "
                                  "pass --status-port too")
        if not is_loopback(args.status_host):
            raise StatusPageError("--status-show-records puts statistics of this site's records (not differentially "
                                  "private) on its status page, which is served on a loopback --status-host only, "
                                  f"not on {args.status_host}")
    server = bind(args, SITE_PAGE, "site's status page")
    return None if server is None else SitePage(server, args.max_epsilon, args.status_show_records)


SITE_PAGE = page("fedsbdt site", """
<h1>fedsbdt site <span id="site">—</span></h1>
<div class="sub">stage <b id="stage">—</b> · plan <code id="plan">—</code><span id="tuning"></span> · noise
 <span id="noise">—</span></div>
<h2>This site</h2>
<div class="grid">
 <div class="card"><div class="k">trees applied</div><div class="v"><span id="trees">—</span> / <span id="total">—</span></div>
  <div class="bar"><div id="treebar" style="width:0"></div></div></div>
 <div class="card"><div class="k">rounds answered</div><div class="v" id="answered">—</div></div>
 <div class="card"><div class="k">failed attempts / session limit</div><div class="v"><span id="failed">—</span> /
  <span id="failedlimit">—</span></div><div class="sub">per round: <span id="roundlimit">—</span></div></div>
 <div class="card"><div class="k">refusals</div><div class="v" id="refusals">—</div><div class="sub" id="lastref"></div></div>
 <div class="card"><div class="k">plan's ε</div><div class="v" id="epsplan">—</div><div class="sub" id="limit"></div></div>
</div>
<p class="sub" id="ledgernote"></p>
<div id="ledger" hidden>
<h2>Privacy ledger (<span id="records">—</span> records)</h2>
<div class="grid">
 <div class="card"><div class="k">ε spent: max</div><div class="v" id="epsmax">—</div>
  <div class="bar"><div id="epsbar" style="width:0"></div></div></div>
 <div class="card"><div class="k">median · 90 % · 99 % of records</div><div class="v"><span id="p50">—</span> · <span id="p90">—</span> · <span id="p99">—</span></div>
  <div class="sub" id="epsnote"></div></div>
 <div class="card"><div class="k">records out of budget</div><div class="v" id="exhausted">—</div></div>
 <div class="card"><div class="k">tree rounds with data</div><div class="v" id="treerounds">—</div></div>
</div>
</div>
""", """
function render(s){
  setText("site",s.site_id);setText("stage",s.stage);setText("plan",s.plan_sha256?s.plan_sha256.slice(0,16)+"…":"not yet accepted");
  setText("tuning",s.tuning?" · tuning trial "+s.tuning.trial+" of "+s.tuning.trials:"");
  setText("noise",s.noise);setText("trees",s.trees_applied);setText("total",s.trees_total);
  bar("treebar",s.trees_total?s.trees_applied/s.trees_total:0);
  setText("answered",s.rounds_answered);
  setText("refusals",s.refusals);$("refusals").className="v"+(s.refusals?" warn":"");setText("lastref",s.last_refusal||"");
  var f=s.failed_attempts;
  if(f){setText("failed",f.session);setText("failedlimit",f.limit);setText("roundlimit",f.per_round_limit);
    $("failed").className=f.session?"warn":"";}
  var e=s.epsilon,r=s.records;
  setText("ledgernote",r?"Record statistics shown (--status-show-records): computed from this site's records, not "+
    "differentially private; keep this page on the site's side.":"Record statistics (record count, ε per record, "+
    "records out of budget) are not shown: they are not differentially private. A loopback page shows them with "+
    "--status-show-records.");
  $("ledger").hidden=!r;
  if(!e)return;
  setText("epsplan",num(e.planned,4));
  setText("limit","δ = "+e.delta+" · "+(s.max_epsilon===null?"no --max-epsilon":"this site's --max-epsilon "+s.max_epsilon)+
    (e.eval===null?"":" · the plan's total with ε_eval "+e.eval+" of the held-out records: "+num(e.total,4)));
  if(!r)return;
  setText("records",r.count);setText("epsmax",num(r.max,4));bar("epsbar",e.planned?r.max/e.planned:0);
  setText("p50",num(r.p50,4));setText("p90",num(r.p90,4));setText("p99",num(r.p99,4));
  setText("epsnote",(r.per_record?"per-record Rényi filter":"every record charged the worst case")+
    (r.exact?"":" (bound: the plan's ε)"));
  setText("exhausted",r.per_record?r.exhausted:"—");setText("treerounds",r.tree_rounds_with_data);
}
""")
