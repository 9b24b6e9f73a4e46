"""The live status pages (``--status-port``) of a real federation, read by a real headless Chromium and by
``prometheus_client``'s parser.

One module-scoped federation (3-site roster, mutual TLS) serves every assertion:

1. the coordinator and hospital-1 start with status pages; with one site of t = 2 connected the session
   keeps gathering, so both pages are drawn by Chromium in a stable state (the roster named, 0 trees);
2. hospital-2 starts with a loopback page that opts in to its record statistics (``--status-show-records``),
   the session runs; mid-training both sites' ``/metrics`` and ``status.json`` are read;
3. every tree released, the coordinator waits (deadline ``finish``) for hospital-3, which never joins:
   its page is drawn again (a higher tree count) and ``/metrics`` is checked against the model.

Chromium comes from the Debian package (``.ci/browser-setup.sh`` installs it in CI); without it these
tests fail, they never skip.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedsbdt.common.accountant import calibrate, default_alpha_max, epsilon_rdp, epsilon_so_far
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.pki import ca_init
from fedsbdt.common.federation.plan import Deadlines

from .conftest import SITES, Cluster, abalone_with_ids, tls_session_files
from .processes import ROOT, free_port

CHROMIUM = os.environ.get("FEDSBDT_CHROMIUM", "/usr/bin/chromium")
HP = Hyperparameters(trees=16, depth=2, seed=11, epsilon=1.0, init_share=0.05)


def chromium_dom(url: str, budget_ms: int = 2500) -> str:
    """The page's DOM after ``budget_ms`` of (virtual) time in a fresh headless Chromium profile."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run .ci/browser-setup.sh (Debian package chromium)"
    with tempfile.TemporaryDirectory(prefix="fedsbdt-chromium-") as profile:
        r = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
             "--dump-dom", url],
            capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and "<html" in r.stdout, (r.returncode, r.stderr[-2000:])
    return r.stdout


class Dom(HTMLParser):
    """Text by element id, the table rows' cells, the body's attributes (enough to read our pages)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.rows: list[list[str]] = []
        self.body: dict[str, str] = {}
        self._open: list[str | None] = []
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag in ("br", "meta", "link", "img", "input"):
            return
        self._open.append(a.get("id"))
        if a.get("id"):
            self.text.setdefault(a["id"], "")
        if tag == "tr":
            self.rows.append([])
        if tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("br", "meta", "link", "img", "input"):
            return
        if self._open:
            self._open.pop()
        if tag == "td" and self._cell is not None and self.rows:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        for i in self._open:
            if i:
                self.text[i] += data
        if self._cell is not None:
            self._cell.append(data)


def get(url: str, host: str | None = None, headers: dict | None = None) -> tuple[int, str, dict]:
    req = urllib.request.Request(url, headers={**({"Host": host} if host else {}), **(headers or {})})
    def joined(h) -> dict:  # a header sent more than once: its values joined, as one header would list them
        return {k: ", ".join(h.get_all(k)) for k in h.keys()}

    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(), joined(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), joined(e.headers)


def metrics(url: str) -> dict[str, float]:
    """Every sample of ``url``/metrics, by name (with labels in braces when it has any)."""
    code, text, _ = get(url + "metrics")
    assert code == 200
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


class Federation:
    def __init__(self, root: Path) -> None:
        ca = root / "ca"
        ca_init(ca, days=2)
        schema, raw = abalone_with_ids(300)
        self.files = tls_session_files(root, ca, schema, raw, HP, SITES,
                                       deadlines=Deadlines(join=1.0, stage=10.0, quorum=120.0, finish=120.0))
        self.plan = self.files.plan
        self.cluster = Cluster(root, root / "plan.toml")
        self.root = root
        self.coord_port, self.site_port, self.site2_port = free_port(), free_port(), free_port()
        self.coordinator = self.cluster.coordinator("--status-port", str(self.coord_port))
        self.url = f"http://127.0.0.1:{self.coord_port}/"
        self.site_url = f"http://127.0.0.1:{self.site_port}/"
        self.site2_url = f"http://127.0.0.1:{self.site2_port}/"
        self.h1 = self.cluster.site("hospital-1", self.files.data["hospital-1"], "--status-port", str(self.site_port))
        self.h2 = None
        c = self.cluster
        c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "status_page")
        c.wait_event(lambda e: e.get("_proc") == "hospital-1" and e.get("event") == "status_page")
        c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "connected"
                     and e.get("site") == "hospital-1")
        self.wait_status(lambda st: [x["connected"] for x in st["sites"]] == [True, False, False])
        self.gathering_dom = Dom(chromium_dom(self.url, 3500))
        self.gathering_json = json.loads(get(self.url + "status.json")[1])
        self.site_dom = Dom(chromium_dom(self.site_url))
        # the session starts once a second site is connected (t = 2; the join deadline has passed)
        self.h2 = c.site("hospital-2", self.files.data["hospital-2"], "--status-port", str(self.site2_port),
                         "--status-show-records")
        c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "tree" and e["tree"] >= 2)
        self.site_metrics, self.site_metrics_text = metrics(self.site_url), get(self.site_url + "metrics")[1]
        self.site_json = json.loads(get(self.site_url + "status.json")[1])
        self.site2_metrics = metrics(self.site2_url)
        self.site2_json = json.loads(get(self.site2_url + "status.json")[1])
        c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "finished", timeout=180)
        for p in (self.h1, self.h2):  # their streams closed: the page shows them disconnected
            assert p.wait() == 0, p.errors
        for sid in ("hospital-1", "hospital-2"):
            c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "disconnected"
                         and e.get("site") == sid)
        self.wait_status(lambda st: not any(x["connected"] for x in st["sites"]))
        self.failed_rounds = sum(1 for e in c.events if e.get("_proc") == "coordinator"
                                 and e.get("event") == "round_failed")
        self.model = json.loads((root / "coordinator" / "model.json").read_text())


    def wait_status(self, cond, timeout: float = 20.0) -> dict:
        """status.json once ``cond`` holds for it (the page's snapshot follows the session within a tick)."""
        deadline = time.monotonic() + timeout
        while True:
            st = json.loads(get(self.url + "status.json")[1])
            if cond(st):
                return st
            assert time.monotonic() < deadline, st
            time.sleep(0.05)


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    f = None
    root = tmp_path_factory.mktemp("status")
    try:
        f = Federation(root)
        yield f
    finally:
        if f is not None:
            f.cluster.stop()


def test_the_coordinator_page_renders_in_chromium_names_the_sites_and_refreshes_itself(fed):
    d = fed.gathering_dom
    assert d.text["stage"] == "gathering" and d.text["trees"] == "0" and d.text["total"] == str(HP.total_rounds)
    assert [r[0] for r in d.rows if r] == SITES  # the roster, in the plan's order
    row = {r[0]: r for r in d.rows if r}
    assert row["hospital-1"][1:4] == ["yes", "yes", "yes"]  # joined, connected, caught up
    assert row["hospital-2"][1:3] == ["no", "no"] and row["hospital-2"][6] == "never"
    assert d.text["epsplan"] == f"{fed.plan.stated_epsilon:.4f}" and d.text["eps"] == "0.0000"
    assert int(d.body["data-polls"]) >= 2  # it fetched status.json more than once by itself
    assert d.text["conn"].startswith("live")
    # after training, a later page shows every tree released, the rounds' latency and ε spent
    late = Dom(chromium_dom(fed.url))
    assert int(late.text["trees"]) == HP.total_rounds > int(d.text["trees"])
    assert late.text["stage"] == "finishing" and late.text["eta"] == "done"
    assert late.text["eps"] == f"{fed.plan.stated_epsilon:.4f}"
    assert late.text["failed"] == str(fed.failed_rounds)
    # and the coordinator's log says for whom it waits at the end (hospital-3 never joined)
    said = [e for e in fed.cluster.events if e.get("_proc") == "coordinator"
            and e.get("event") == "awaiting_confirmations"]
    assert said and said[-1]["sites"] == ["hospital-3"]
    assert re.fullmatch(r"[0-9.]+ m?s", late.text["lat"]), late.text["lat"]
    assert re.fullmatch(rf"mean [0-9.]+ m?s over {HP.total_rounds + 1} rounds", late.text["latmean"])
    row = {r[0]: r for r in late.rows if r}
    # the two sites confirmed the model and left; hospital-3 never joined: the session waits for it
    assert row["hospital-1"][1:5] == row["hospital-2"][1:5] == ["yes", "no", "yes", str(HP.total_rounds)]
    assert row["hospital-3"][1:4] == ["no", "no", "no"] and row["hospital-3"][6] == "never"
    assert re.fullmatch(r"[0-9.]+ m?s ago", row["hospital-1"][6]), row["hospital-1"]


def test_the_page_is_self_contained(fed):
    code, html, headers = get(fed.url)
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing from another origin
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert get(fed.url + "nothing")[0] == 404
    assert get(fed.url + "status.json", host="evil.example:80")[0] == 403  # DNS rebinding: not a loopback name
    assert get(fed.url + "status.json", host=f"localhost:{fed.coord_port}")[0] == 200


def test_coordinator_metrics_match_the_session(fed):
    m = metrics(fed.url)
    model, st = fed.model, json.loads(get(fed.url + "status.json")[1])
    rounds = model["training"]["rounds"]
    assert m["fedsbdt_trees_released_total"] == len(rounds) == HP.total_rounds == st["trees_released"]
    assert m["fedsbdt_trees_planned"] == HP.total_rounds
    assert m["fedsbdt_sites_connected"] == 0 and m["fedsbdt_sites_joined"] == 2 and m["fedsbdt_sites_roster"] == 3
    assert m["fedsbdt_sites_suspended"] == 0
    assert m["fedsbdt_failed_rounds_total"] == st["rounds_failed"] == fed.failed_rounds
    # one latency sample per released round: the initial score and every tree
    assert m["fedsbdt_round_seconds_count"] == len(rounds) + (model["training"]["init"]["round_id"] is not None)
    assert m['fedsbdt_round_seconds_bucket{le=+Inf}'] == m["fedsbdt_round_seconds_count"]
    assert 0 < m["fedsbdt_round_seconds_sum"] < 120
    assert m["fedsbdt_eta_seconds"] == 0
    # ε: all accounted rounds and the initial score released: exactly the plan's ε (its own calibration)
    assert m["fedsbdt_epsilon_planned"] == pytest.approx(fed.plan.stated_epsilon, rel=1e-12)
    assert m["fedsbdt_epsilon_spent"] == pytest.approx(fed.plan.stated_epsilon, rel=1e-9)
    assert st["epsilon"]["exact"] is True
    # issue 37: nothing computed from a site's records (the coordinator sees only noisy sums; the page shows the
    # plan's statement, counts, and the ε of the releases so far): a fixed list of metrics, no record statistics
    families = {f.name for f in text_string_to_metric_families(get(fed.url + "metrics")[1])
                if not f.name.endswith("_created")}  # (prometheus_client's creation times of counters)
    assert families == {"fedsbdt_trees_released", "fedsbdt_trees_planned", "fedsbdt_failed_rounds",
                        "fedsbdt_round_seconds", "fedsbdt_sites_connected", "fedsbdt_sites_joined",
                        "fedsbdt_sites_caught_up", "fedsbdt_sites_suspended", "fedsbdt_sites_roster",
                        "fedsbdt_epsilon_spent", "fedsbdt_epsilon_planned", "fedsbdt_eta_seconds"}, families
    assert not keys(st) & (RECORD_KEYS - {"count"}), st  # (round_seconds.count: released rounds)


def test_epsilon_so_far_agrees_with_an_independent_calibration():
    """The ε of k of T rounds, recalibrated for k rounds at that ε, gives back the same σ (the accountant's
    bisection, an independent path); it grows with k and reaches the plan's ε at T."""
    hp = HP
    cal = calibrate(hp.epsilon, hp.delta, hp.subsample, hp.accounted_rounds, hp.init_share, hp.eps_ds)
    eps = [epsilon_so_far(cal, k, True, hp.epsilon) for k in (0, 1, 5, 10, hp.accounted_rounds)]
    assert eps == sorted(eps) and eps[0] > 0 and epsilon_so_far(cal, 0, False, hp.epsilon) == 0.0
    assert eps[-1] == pytest.approx(cal.epsilon, rel=1e-12)
    assert eps[2] == epsilon_rdp(cal.sigma, cal.gamma, 5, cal.delta, cal.eps_init, cal.eps_ds,
                                 default_alpha_max(hp.epsilon, hp.delta))[0]  # Thm. 23 + Cor. 6, one vector op
    assert epsilon_so_far(cal, hp.accounted_rounds + 5, True, hp.epsilon) == eps[-1]  # retries beyond: capped
    for k, e in zip((5, 10), eps[2:4]):
        back = calibrate(e * (1 + 1e-12), hp.delta, hp.subsample, k, hp.init_share * hp.epsilon / e, hp.eps_ds,
                         alpha_max=None)
        assert back.sigma == pytest.approx(cal.sigma, rel=1e-5), k


#: Everything a site's page and /metrics show by default: no value computed from its records (issue 37, finding 7).
SITE_METRICS = {"fedsbdt_site_trees_applied", "fedsbdt_site_rounds_answered_total", "fedsbdt_site_refusals_total",
                "fedsbdt_site_failed_attempts_total", "fedsbdt_site_failed_attempts_limit",
                "fedsbdt_site_epsilon_planned"}
#: What only a loopback page with --status-show-records adds (statistics of the site's records, not DP).
RECORD_KEYS = {"records", "count", "max", "p50", "p90", "p99", "exhausted", "tree_rounds_with_data"}


def keys(x) -> set:
    """Every key of a JSON value, at any depth."""
    if isinstance(x, dict):
        return set(x) | set().union(*(keys(v) for v in x.values()))
    return set().union(*(keys(v) for v in x)) if isinstance(x, list) else set()


def test_the_site_page_shows_no_record_statistics_by_default(fed):
    """Issue 37 finding 7: the page (drawn by Chromium), status.json and /metrics of a site show the plan's public
    statement and counts of rounds and attempts, never its record count, ε quantiles or records out of budget."""
    d, m, st = fed.site_dom, fed.site_metrics, fed.site_json
    assert d.text["site"] == "hospital-1" and d.text["stage"] == "participating"
    for shown_only_with_the_flag in ("records", "epsmax", "p50", "p90", "p99", "exhausted"):
        assert d.text.get(shown_only_with_the_flag, "—") == "—", (shown_only_with_the_flag, d.text)
    assert {k.split("{")[0] for k in m} == SITE_METRICS
    assert "record" not in fed.site_metrics_text.lower() and "quantile" not in fed.site_metrics_text
    assert st["records"] is None and not keys(st) & (RECORD_KEYS - {"records"}), st
    assert d.text["plan"] == fed.plan.sha256[:16] + "…" and d.text["refusals"] == "0"
    assert d.text["epsplan"] == f"{fed.plan.stated_epsilon:.4f}" and d.text["failed"] == "0"
    assert d.text["failedlimit"] == "3"  # 16 trees: a tenth is 2, the per-round limit 3 is more
    assert "--status-show-records" in d.text["ledgernote"]
    assert m["fedsbdt_site_epsilon_planned"] == fed.plan.stated_epsilon and m["fedsbdt_site_refusals_total"] == 0
    assert m["fedsbdt_site_rounds_answered_total"] >= 2 and m["fedsbdt_site_trees_applied"] >= 1
    assert m["fedsbdt_site_failed_attempts_total"] == 0 and m["fedsbdt_site_failed_attempts_limit"] == 3
    assert st["epsilon"] == {"planned": fed.plan.stated_epsilon, "delta": fed.plan.hyperparameters.delta,
                             "eval": None, "total": fed.plan.total_epsilon}  # the plan's public statement only
    assert st["failed_attempts"] == {"session": 0, "limit": 3, "per_round_limit": 3}


def test_a_loopback_page_that_opts_in_shows_the_sites_own_ledger(fed):
    """``--status-show-records`` (loopback only): the record count and every record's ε, as before."""
    m, st = fed.site2_metrics, fed.site2_json
    n = sum(1 for _ in open(fed.files.data["hospital-2"])) - 1
    assert m["fedsbdt_site_records"] == n == st["records"]["count"]
    q = [m[f"fedsbdt_site_epsilon_spent{{quantile={p}}}"] for p in ("0.5", "0.9", "0.99", "1")]
    assert q == sorted(q) and 0 < q[-1] == m["fedsbdt_site_epsilon_max"] <= fed.plan.stated_epsilon
    # without the filter every record is charged the worst case of the tree rounds it sent data in
    k = st["records"]["tree_rounds_with_data"]
    cal = fed.plan.calibration()
    assert q[0] == q[-1] == pytest.approx(epsilon_so_far(cal, k, True, HP.epsilon), rel=1e-12)
    assert SITE_METRICS <= {k.split("{")[0] for k in m}


def test_a_page_beyond_loopback_needs_a_token_and_never_shows_records(tmp_path, fed):
    """Bound beyond loopback a page needs --status-token-file (refused without one: one line, exit 2, for the
    coordinator and the site); --status-show-records is refused there even with a token.  A site page on 0.0.0.0
    with a token answers 401 to a request without it, and shows no record statistics to one with it."""
    token = tmp_path / "status.token"
    token.write_text("s3cret-token-0123456789abcdef\n")
    plan, data3, key3 = str(fed.root / "plan.toml"), str(fed.files.data["hospital-3"]), fed.root / "hospital-3"
    coordinator = ["coordinator", "--plan", plan, "--state", str(tmp_path / "coordinator"), "--insecure",
                   "--listen", "127.0.0.1:0", "--allow-insecure-test-randomness"]
    site = ["client", "--coordinator", "127.0.0.1:9", "--site", "hospital-3", "--plan", plan, "--data", data3,
            "--state", str(tmp_path / "hospital-3"), "--identity-key", str(key3 / "identity.key"), "--insecure",
            "--reconnect-timeout", "60"]
    for argv, line in (
            ([*coordinator, "--status-port", "0", "--status-host", "0.0.0.0"],
             "fedsbdt coordinator: error: --status-host 0.0.0.0 serves the coordinator's status page beyond this "
             "machine: pass --status-token-file FILE (a secret every request must send as `Authorization: Bearer "
             "…`), or bind a loopback address"),
            ([*site, "--status-port", "0", "--status-host", "0.0.0.0"],
             "fedsbdt client: error: --status-host 0.0.0.0 serves the site's status page beyond this machine: pass "
             "--status-token-file FILE (a secret every request must send as `Authorization: Bearer …`), or bind a "
             "loopback address"),
            ([*site, "--status-port", "0", "--status-host", "0.0.0.0", "--status-token-file", str(token),
              "--status-show-records"],
             "fedsbdt client: error: --status-show-records puts statistics of this site's records (not "
             "differentially private) on its status page, which is served on a loopback --status-host only, not "
             "on 0.0.0.0")):
        r = subprocess.run([sys.executable, "-m", "fedsbdt.cli", *argv], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [line], (argv, r.stderr)
    assert not (tmp_path / "coordinator").exists()  # nothing written
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "fedsbdt.cli", "--log-format", "json", *site, "--status-port",
                          str(port), "--status-host", "0.0.0.0", "--status-token-file", str(token)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}/"
        bearer = {"Authorization": "Bearer s3cret-token-0123456789abcdef"}
        deadline = time.monotonic() + 60
        while True:  # the page serves once the site accepted the plan (it then waits for the coordinator)
            try:
                code, body, _ = get(url + "status.json", headers=bearer)
                if code == 200 and json.loads(body)["stage"] == "participating":
                    break
            except OSError:
                pass
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.2)
        for path in ("", "status.json", "metrics"):
            code, _, headers = get(url + path)
            assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (path, code)
            assert get(url + path, headers={"Authorization": "Bearer not-the-token"})[0] == 401
            assert get(url + path, headers=bearer)[0] == 200
        st = json.loads(get(url + "status.json", headers=bearer)[1])
        assert st["records"] is None and not keys(st) & (RECORD_KEYS - {"records"}), st
        text = get(url + "metrics", headers=bearer)[1]
        assert {f.name for f in text_string_to_metric_families(text)} == {k.removesuffix("_total") for k in SITE_METRICS}
    finally:
        p.kill()
        p.wait(timeout=30)


def test_a_taken_status_port_is_one_line_and_exit_2(tmp_path, fed):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        state = tmp_path / "coordinator"
        for argv, what in (
                (["coordinator", "--plan", str(fed.root / "plan.toml"), "--state", str(state), "--insecure",
                  "--listen", "127.0.0.1:0", "--allow-insecure-test-randomness"], "coordinator"),
                (["client", "--coordinator", "127.0.0.1:9", "--site", "hospital-3", "--plan",
                  str(fed.root / "plan.toml"), "--data", str(fed.files.data["hospital-3"]), "--state",
                  str(fed.root / "hospital-3"), "--insecure"], "site")):
            r = subprocess.run([sys.executable, "-m", "fedsbdt.cli", *argv, "--status-port", str(port)],
                               capture_output=True, text=True, cwd=ROOT, timeout=60)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1, (what, r.stderr)
            assert f"cannot serve the {what}'s status page on 127.0.0.1:{port}" in lines[0], lines
        assert not state.exists()  # nothing written


def test_demo_passes_its_status_flags_to_the_coordinator():
    from fedsbdt.cli import build_parser
    from fedsbdt.demo import status_flags

    assert status_flags(build_parser().parse_args(["demo"])) == []
    args = build_parser().parse_args(["demo", "--status-port", "8080", "--status-host", "0.0.0.0"])
    assert status_flags(args) == ["--status-port", "8080", "--status-host", "0.0.0.0"]


def test_the_site_ledger_page_with_the_filter_charges_each_record_its_own_ledger(tmp_path):
    """With the individual filter a record's ε is its own ledger's (Cor. 6 at α̂): a record that spent the whole
    budget, after the initial score, is at exactly the plan's ε (the calibration's own value), before it below;
    the refusals are this site's ``refused`` events."""
    import logging
    from types import SimpleNamespace

    import numpy as np

    from fedsbdt.client.ledger import SiteLedger, ledger_path
    from fedsbdt.client.policy import SitePolicy
    from fedsbdt.client.status import SITE_PAGE, SiteMonitor
    from fedsbdt.common.statuspage import StatusServer
    from fedsbdt.common.engine import filter_for
    from fedsbdt.common.rdp_filter import UNITS_PER_ROUND

    from .conftest import make_identities, make_test_plan

    schema, _ = abalone_with_ids(30)
    hp = Hyperparameters(trees=6, depth=2, seed=1, epsilon=1.0, filter=True, init_share=0.05)
    plan = make_test_plan(schema, make_identities(tmp_path, SITES), hp)
    cal = plan.calibration()
    table = filter_for(hp, cal)
    ledger = SiteLedger(ledger_path(tmp_path / "hospital-1", plan.sha256), plan.sha256, "hospital-1")
    ids = np.arange(4)
    ledger.ensure_records(ids)
    spent = np.array([table.budget_units, table.budget_units // 2, UNITS_PER_ROUND, 0])
    machine = SimpleNamespace(site_id="hospital-1", plan=plan, cal=cal, table=table, state_dir=tmp_path / "hospital-1",
                              stage=SimpleNamespace(name="participating"), trees_applied=3, ledger=ledger,
                              options=SimpleNamespace(policy=SitePolicy()))
    mon = SiteMonitor(machine, max_epsilon=2.0, show_records=True)
    hidden = SiteMonitor(machine, max_epsilon=2.0)  # the default: none of it
    server = StatusServer("127.0.0.1", 0, SITE_PAGE, "site's status page")
    try:
        with ledger.transaction():
            ledger.charge(ids, np.zeros(4, np.int64), spent)
        e = mon._snapshot(0.0)["records"]
        assert e["per_record"] and e["count"] == 4 and e["exhausted"] == 1
        assert e["max"] < cal.epsilon  # no initial score sent yet: the trees' part only
        with ledger.transaction():
            ledger.log_contribution(1, "init", None, True, None, None)
        logging.getLogger("fedsbdt.site").warning("x", extra={"event": "refused", "site": "hospital-1"})
        logging.getLogger("fedsbdt.site").warning("y", extra={"event": "refused", "site": "hospital-2"})
        s = mon._snapshot(1.0)
        e = s["records"]
        assert e["max"] == pytest.approx(cal.epsilon, rel=1e-12)
        assert 0 < e["p50"] < e["p90"] < e["max"]
        assert s["rounds_answered"] == 1 and s["refusals"] == 1 and s["max_epsilon"] == 2.0
        assert hidden._snapshot(1.0)["records"] is None and hidden._snapshot(1.0)["rounds_answered"] == 1
        # the opted-in page, drawn by Chromium over real HTTP
        server.start(mon.current, mon.registry)
        d = Dom(chromium_dom(server.url))
        assert d.text["records"] == "4" and d.text["exhausted"] == "1" and d.text["epsmax"] == f"{e['max']:.4f}"
        assert d.text["p50"] == f"{e['p50']:.4f}" and "per-record Rényi filter" in d.text["epsnote"]
    finally:
        server.close()
        mon.close()
        hidden.close()
        ledger.close()


def test_a_token_guards_every_path_and_a_browser_may_send_it_as_the_basic_password(tmp_path):
    """``--status-token-file`` on any address: every path answers 401 without the token (sent as a Bearer token,
    or as the password of HTTP Basic authentication, which a browser asks for); a token file that is missing,
    empty or too short to be a secret is refused with one sentence."""
    import argparse
    import base64

    from fedsbdt.common.statuspage import StatusPageError, add_status_flags, bind

    parser = argparse.ArgumentParser()
    add_status_flags(parser)
    token = tmp_path / "token"
    for content, message in ((None, "cannot read --status-token-file"), ("\n", "is empty"),
                             ("short", "is too short to be a secret"), ("two words in a token", "one line")):
        if content is not None:
            token.write_text(content)
        with pytest.raises(StatusPageError, match=message):
            bind(parser.parse_args(["--status-port", "0", "--status-token-file", str(token)]), "<p>x</p>", "page")
    token.write_text("  0123456789abcdef0123  \n")
    server = bind(parser.parse_args(["--status-port", "0", "--status-token-file", str(token)]), "<p>x</p>", "page")
    try:
        server.start(lambda: {"ok": 1}, server.registry)
        basic = lambda user_pw: {"Authorization": "Basic " + base64.b64encode(user_pw.encode()).decode()}  # noqa: E731
        for path in ("", "status.json", "metrics", "nothing"):
            assert get(server.url + path)[0] == 401
            assert get(server.url + path, headers={"Authorization": "Bearer 0123456789abcdef012"})[0] == 401
            assert get(server.url + path, headers=basic("any:0123456789abcdef0124"))[0] == 401
            want = 404 if path == "nothing" else 200
            assert get(server.url + path, headers={"Authorization": "Bearer 0123456789abcdef0123"})[0] == want
            assert get(server.url + path, headers=basic("operator:0123456789abcdef0123"))[0] == want
        code, body, headers = get(server.url)
        assert body == "unauthorized: send the status token (Authorization: Bearer …)\n"
        assert headers["WWW-Authenticate"].startswith('Bearer realm="fedsbdt"')
    finally:
        server.close()
