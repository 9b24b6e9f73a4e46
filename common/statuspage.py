"""The live status page of a long-running command (``--status-port``): a small HTTP server in a daemon thread.

    GET /             a self-contained HTML page (inline CSS and JavaScript, nothing fetched from elsewhere:
                      it works offline) that fetches ``status.json`` every REFRESH_MS and redraws itself
    GET /status.json  the current snapshot (one JSON object)
    GET /metrics      the Prometheus text format of the command's own :class:`CollectorRegistry`

The server only *reads*: ``snapshot()`` (a callable the coordinator or site module provides) returns a
thread-safe copy of the state, and the metrics live in a per-process registry (no global state).  It
binds 127.0.0.1 unless ``--status-host`` says otherwise; bound to a loopback address it also refuses a
request whose ``Host`` header names anything but a loopback host (a web page elsewhere that rebinds its
DNS name to 127.0.0.1 cannot read the status).  Bound to any other address it needs ``--status-token-file``:
a secret every request must send, as ``Authorization: Bearer TOKEN`` (Prometheus, curl) or as the password of
HTTP Basic authentication (a browser asks for it); without the token every path answers 401.  (Over plain
HTTP the token crosses the network in clear: a network only the operators reach, or a TLS proxy in front.)
A port already in use, a page beyond loopback without a token, or a token file that cannot be one is a
:class:`StatusPageError` (the commands turn it into one line and exit 2 before they do anything else).
"""
from __future__ import annotations

import argparse
import base64
import hmac
import ipaddress
import json
import logging
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("fedsbdt.status")

REFRESH_MS = 1000
DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
UNAUTHORIZED = "unauthorized: send the status token (Authorization: Bearer …)\n".encode()
#: The shortest token ``--status-token-file`` may hold (e.g. ``openssl rand -hex 32`` writes 64 characters).
MIN_TOKEN_CHARS = 16
#: The page may run its own inline script and style and fetch from its own origin; nothing else.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class StatusPageError(RuntimeError):
    """The status page cannot be served (the message is one sentence)."""


def add_status_flags(p: argparse.ArgumentParser):
    """``--status-port``, ``--status-host`` and ``--status-token-file`` (the live status page and ``/metrics``);
    returns their argument group (a command adds its own page's flags to it)."""
    g = p.add_argument_group("live status page (docs/deployment.md \"Status page and metrics\")")
    g.add_argument("--status-port", type=int, metavar="PORT",
                   help="serve a live status page on this port: / (HTML), /status.json and /metrics (Prometheus); "
                        "0 picks a free port (default: no status page)")
    g.add_argument("--status-host", default=DEFAULT_HOST, metavar="HOST",
                   help=f"address the status page binds (default: {DEFAULT_HOST}, this machine only; 0.0.0.0 "
                        "serves every interface, and needs --status-token-file)")
    g.add_argument("--status-token-file", metavar="FILE",
                   help="a file holding a secret token (one line, at least 16 characters, e.g. `openssl rand -hex "
                        "32`) that every request to the page must send, as `Authorization: Bearer TOKEN` or as the "
                        "password of HTTP Basic authentication (browsers); required with a --status-host other than "
                        "a loopback address (default: none, loopback only)")
    return g


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name of this machine's loopback) reaches this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, family: int, handler) -> None:
        self.address_family = family
        super().__init__(address, handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: its getfqdn() may wait on DNS
        self.server_name, self.server_port = self.server_address[:2]


class StatusServer:
    """Serves ``page`` (HTML), ``snapshot()`` as ``/status.json`` and ``registry`` as ``/metrics``; binds the
    port on construction (so that a command can refuse a taken port before it starts anything) and serves
    from :meth:`start` on."""

    def __init__(self, host: str, port: int, page: str, what: str = "status page",
                 token: str | None = None) -> None:
        from prometheus_client import CollectorRegistry  # only a command with --status-port loads it

        self.page = page.encode()
        self.token = None if token is None else token.encode()  # every request must send it (401 otherwise)
        self.snapshot: Callable[[], dict] = dict
        self.registry = CollectorRegistry(auto_describe=True)
        self.loopback_only = is_loopback(host)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.httpd = _HttpServer((host, port), family, self._handler())
        except OSError as e:
            raise StatusPageError(f"cannot serve the {what} on {host}:{port}: {e.strerror or e} "
                                  "(choose another --status-port)") from None
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="status-page", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}/"

    def start(self, snapshot: Callable[[], dict], registry: "CollectorRegistry") -> "StatusServer":
        """Serve ``snapshot()`` and ``registry`` from now on (the port is bound from construction on); called
        again — the next session of a tuning plan — it serves the new ones on the same port."""
        self.snapshot, self.registry = snapshot, registry
        if not self._thread.is_alive():
            self._thread.start()
            log.info(f"status page at {self.url} (Prometheus metrics at {self.url}metrics)",
                     extra={"event": "status_page", "url": self.url, "port": self.port})
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "fedsbdt-status"
            sys_version = ""

            def log_message(self, fmt, *args) -> None:  # no access log on stderr (it is the JSON log)
                log.debug("status page: " + fmt % args, extra={"event": "status_request"})

            def do_HEAD(self) -> None:
                self.do_GET(body=False)

            def do_GET(self, body: bool = True) -> None:
                if server.loopback_only and not is_loopback(_host_of(self.headers.get("Host", ""))):
                    return self._send(403, "text/plain; charset=utf-8", b"forbidden: not a loopback host name\n",
                                      body)
                if server.token is not None and not _authorized(self.headers.get("Authorization", ""), server.token):
                    return self._send(401, "text/plain; charset=utf-8", UNAUTHORIZED, body,
                                      [("WWW-Authenticate", 'Bearer realm="fedsbdt"'),
                                       ("WWW-Authenticate", 'Basic realm="fedsbdt", charset="UTF-8"')])
                path = self.path.split("?", 1)[0]
                try:
                    if path in ("/", "/index.html"):
                        return self._send(200, "text/html; charset=utf-8", server.page, body)
                    if path == "/status.json":
                        data = json.dumps(server.snapshot(), sort_keys=True, allow_nan=False).encode()
                        return self._send(200, "application/json", data, body)
                    if path == "/metrics":
                        return self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry), body)
                except Exception:  # a bug in a snapshot must not end the command it watches
                    log.exception("status page: cannot build the answer", extra={"event": "status_error"})
                    return self._send(500, "text/plain; charset=utf-8", b"internal error\n", body)
                self._send(404, "text/plain; charset=utf-8", b"not found: try /, /status.json or /metrics\n", body)

            def _send(self, code: int, ctype: str, data: bytes, body: bool, extra=()) -> None:
                self.send_response(code)
                for name, value in extra:
                    self.send_header(name, value)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Content-Security-Policy", CSP)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        return Handler


def _authorized(header: str, token: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``token``: ``Bearer TOKEN``, or ``Basic`` with TOKEN as the
    password (any user name); compared in constant time."""
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), token)
    if scheme.lower() == "basic":
        try:
            password = base64.b64decode(value, validate=True).partition(b":")[2]
        except ValueError:
            return False
        return hmac.compare_digest(password, token)
    return False


def read_token(path: str) -> str:
    """The token in ``path`` (one line, surrounding white space ignored); StatusPageError if it cannot be one."""
    try:
        text = open(path, encoding="utf-8").read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise StatusPageError(f"cannot read --status-token-file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not text:
        raise StatusPageError(f"--status-token-file {path} is empty; put a secret in it, e.g. `openssl rand -hex 32 "
                              f"> {path}`")
    if any(c.isspace() or not c.isprintable() or not c.isascii() for c in text):
        raise StatusPageError(f"--status-token-file {path} must hold the token alone, on one line (printable ASCII, "
                              "no spaces)")
    if len(text) < MIN_TOKEN_CHARS:
        raise StatusPageError(f"--status-token-file {path} is too short to be a secret ({len(text)} characters, at "
                              f"least {MIN_TOKEN_CHARS}; e.g. `openssl rand -hex 32 > {path}`)")
    return text


def status_token(args: argparse.Namespace, what: str) -> str | None:
    """The token of ``--status-token-file`` (None without it), once the flags are checked: a page beyond loopback
    needs one.  StatusPageError (one sentence naming the flag) otherwise."""
    path = getattr(args, "status_token_file", None)
    if getattr(args, "status_port", None) is None:
        if path is not None:
            raise StatusPageError("--status-token-file guards the status page: pass --status-port too")
        return None
    if not 0 <= args.status_port <= 65535:
        raise StatusPageError(f"--status-port {args.status_port}: a port is a number from 0 to 65535")
    if path is None:
        if not is_loopback(args.status_host):
            raise StatusPageError(f"--status-host {args.status_host} serves the {what} beyond this machine: pass "
                                  "--status-token-file FILE (a secret every request must send as `Authorization: "
                                  "Bearer …`), or bind a loopback address")
        return None
    return read_token(path)


def bind(args: argparse.Namespace, page: str, what: str) -> StatusServer | None:
    """The (bound, not yet serving) server of ``--status-port``; None without the flag."""
    token = status_token(args, what)
    if getattr(args, "status_port", None) is None:
        return None
    return StatusServer(args.status_host, args.status_port, page, what, token)


def page(title: str, body: str, script: str) -> str:
    """A whole self-contained HTML page: the shared style and helpers, ``body`` and the page's ``script``
    (which defines ``render(status)``; the helpers call it with every fetched ``status.json``)."""
    return (_PAGE.replace("__TITLE__", title).replace("__BODY__", body).replace("__SCRIPT__", script)
            .replace("__REFRESH__", str(REFRESH_MS)))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em;color:#1d2330;background:#fafbfc}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}
.sub{color:#5a6475}.grid{display:flex;flex-wrap:wrap;gap:.8em}
.card{background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:.6em .9em;min-width:11em}
.card .k{color:#5a6475;font-size:.85em}.card .v{font-size:1.35em;font-weight:600}
table{border-collapse:collapse;background:#fff;border:1px solid #dde2ea}
th,td{padding:.35em .8em;border-bottom:1px solid #eef1f5;text-align:left}th{background:#f1f4f8;font-weight:600}
.bar{height:.6em;background:#eef1f5;border-radius:3px;overflow:hidden;margin-top:.3em}
.bar>div{height:100%;background:#3b82f6}.warn{color:#b45309}.bad{color:#b91c1c}.ok{color:#15803d}
#conn{float:right;font-size:.85em}
</style></head>
<body data-polls="0">
<span id="conn" class="sub">connecting…</span>
__BODY__
<p class="sub">Refreshes every __REFRESH__ ms from <a href="status.json">status.json</a>;
Prometheus metrics at <a href="metrics">/metrics</a>.</p>
<noscript><p class="bad">This page needs JavaScript to show the status; status.json has it all.</p></noscript>
<script>
"use strict";
function $(id){return document.getElementById(id);}
function setText(id,v){var e=$(id);if(e)e.textContent=(v===null||v===undefined)?"—":String(v);}
function num(x,d){return (x===null||x===undefined)?"—":Number(x).toFixed(d===undefined?3:d);}
function dur(s){if(s===null||s===undefined)return "—";s=Math.max(0,s);if(s<1)return Math.round(1000*s)+" ms";
  if(s<60)return s.toFixed(1)+" s";
  var m=Math.floor(s/60);if(m<60)return m+" min "+Math.round(s-60*m)+" s";return Math.floor(m/60)+" h "+(m%60)+" min";}
function bar(id,frac){var e=$(id);if(e)e.style.width=(100*Math.max(0,Math.min(1,frac||0))).toFixed(1)+"%";}
function rows(id,list,cells){var tb=$(id);if(!tb)return;while(tb.firstChild)tb.removeChild(tb.firstChild);
  list.forEach(function(x){var tr=document.createElement("tr");cells(x).forEach(function(c){
    var td=document.createElement("td");if(typeof c==="object"&&c!==null){td.textContent=c.text;
    if(c.cls)td.className=c.cls;}else{td.textContent=(c===null||c===undefined)?"—":String(c);}
    tr.appendChild(td);});tb.appendChild(tr);});}
__SCRIPT__
function poll(){fetch("status.json",{cache:"no-store"}).then(function(r){
    if(!r.ok)throw new Error("HTTP "+r.status);return r.json();}).then(function(s){
    render(s);document.body.dataset.polls=String(Number(document.body.dataset.polls)+1);
    var c=$("conn");c.textContent="live · updated "+new Date().toLocaleTimeString();c.className="sub";
  }).catch(function(e){var c=$("conn");c.textContent="not reachable ("+e.message+"): the process may have ended";
    c.className="bad";}).finally(function(){setTimeout(poll,__REFRESH__);});}
poll();
</script>
</body></html>
"""
