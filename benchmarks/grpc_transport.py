"""What one stream message costs the server in gRPC itself: the sync (thread pool) server against grpc.aio (a script).

The coordinator's ``Connect`` streams carry 6 messages per site per round.
This measures the server process's CPU per stream message (user and
kernel time, from ``getrusage``) with the coordinator's transport and
nothing else: mutual TLS over loopback, the plan's channel options, a
bidirectional stream per client site in a separate process, each site
sending a 1.1 KB message and waiting for a 1.1 KB reply (a ping-pong like a
round's exchanges), for

* ``sync``: ``grpc.server`` with a thread pool, a reader thread per stream
  handing each message to the handler thread under a condition variable
  (the coordinator's service before the asyncio rewrite);
* ``aio``: ``grpc.aio.server``, one event loop, the stream read and written
  from coroutines (the coordinator's service now).

Server kinds alternate ``--repeats`` times so that both see the same load.

``--rounds``: the floor of a fast round at n sites instead — ``aio-rounds``: each client site on a channel
(a TLS connection) of its own, the server answering every stream only once all ``--streams`` have sent
their message of the round (a barrier, as the coordinator releases a tree once every input is in), so the
server's CPU per round is what a coordinator that does nothing else would spend on its 2n messages.

Run:  python benchmarks/grpc_transport.py [--streams 3] [--messages 2000] [--repeats 3] [--rounds]
Writes ``benchmarks/results/grpc_transport.json`` (``--out``).
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsbdt.common.federation.keys import keygen  # noqa: E402
from fedsbdt.common.federation.pki import TlsFiles, ca_init, ca_server, ca_sign, channel_credentials, server_credentials  # noqa: E402
from fedsbdt.common.federation.wire import GRPC_OPTIONS, SERVER_OPTIONS  # noqa: E402
from fedsbdt.proto.v1 import federation_pb2 as pb  # noqa: E402
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg  # noqa: E402

PAYLOAD = b"x" * 1100  # about a depth-6 tree event or a masked input


def reply() -> pb.EventBatch:
    return pb.EventBatch(events=[pb.Event(seq=1, round=pb.SecAggMessage(secagg=PAYLOAD))], processed=1)


class SyncEcho(pbg.FederationServicer):
    """A reader thread per stream hands each message to the handler thread, which answers it."""

    def Connect(self, requests, context):
        cond, inbox = threading.Condition(), []

        def read() -> None:
            try:
                for m in requests:
                    with cond:
                        inbox.append(m)
                        cond.notify_all()
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        while context.is_active():
            with cond:
                while not inbox and context.is_active():
                    cond.wait(1.0)
                got, inbox[:] = list(inbox), []
            for _ in got:
                yield reply()


class AioEcho(pbg.FederationServicer):
    async def Connect(self, requests, context):
        while await context.read() is not grpc.aio.EOF:
            await context.write(reply())


class AioRounds(pbg.FederationServicer):
    """A reply on every stream once all ``n`` streams have sent their message of the round; ``started``: the
    CPU times when the first round was complete (every connection made and its handshake done)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.waiting: list[asyncio.Future] = []
        self.started: tuple[float, float] | None = None

    async def Connect(self, requests, context):
        while await context.read() is not grpc.aio.EOF:
            arrived = asyncio.get_running_loop().create_future()
            self.waiting.append(arrived)
            if len(self.waiting) == self.n:
                if self.started is None:
                    self.started = _cpu()
                released, self.waiting = self.waiting, []
                for f in released:
                    f.set_result(None)
            await arrived
            await context.write(reply())


def run_clients(target: str, tls_dir: str, streams: int, messages: int, channel_each: bool = False) -> None:
    """The client side (its own process): ``streams`` Connect streams, ``messages`` ping-pongs each; on one
    channel, or with ``channel_each`` on a channel (a connection) per stream."""
    creds = channel_credentials(TlsFiles.in_dir(Path(tls_dir)))
    channels = [grpc.secure_channel(target, creds, options=list(GRPC_OPTIONS))
                for _ in range(streams if channel_each else 1)]
    msg = pb.SiteMessage(round=pb.SecAggSubmission(site_id="site", token=b"t" * 16, secagg=PAYLOAD))

    def one(ch: grpc.Channel) -> None:
        stub = pbg.FederationStub(ch)
        q: queue.SimpleQueue = queue.SimpleQueue()

        def outgoing():
            while (m := q.get()) is not None:
                yield m

        responses = stub.Connect(outgoing())
        for _ in range(messages):
            q.put(msg)
            next(responses)
        q.put(None)
        responses.cancel()

    threads = [threading.Thread(target=one, args=(channels[i % len(channels)],)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ch in channels:
        ch.close()


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def measure(kind: str, pki: Path, streams: int, messages: int) -> dict:
    """Server CPU per stream message (each ping and each pong counts as one) while the clients run."""
    creds = server_credentials(TlsFiles.in_dir(pki / "coordinator"))
    client = [sys.executable, __file__, "--client", "--tls", str(pki / "site"), "--streams", str(streams),
              "--messages", str(messages)] + (["--channel-each"] if kind == "aio-rounds" else [])
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2 * streams + 16), options=list(SERVER_OPTIONS))
        pbg.add_FederationServicer_to_server(SyncEcho(), server)
        port = server.add_secure_port("127.0.0.1:0", creds)
        server.start()
        c0 = _cpu()
        subprocess.run(client + ["--target", f"localhost:{port}"], check=True)
        c1 = _cpu()
        server.stop(None)
    else:
        async def main():
            server = grpc.aio.server(options=list(SERVER_OPTIONS))
            servicer = AioRounds(streams) if kind == "aio-rounds" else AioEcho()
            pbg.add_FederationServicer_to_server(servicer, server)
            port = server.add_secure_port("127.0.0.1:0", creds)
            await server.start()
            c0 = _cpu()
            p = await asyncio.create_subprocess_exec(*client, "--target", f"localhost:{port}")
            if await p.wait():
                raise RuntimeError("the client failed")
            c1 = _cpu()
            await server.stop(None)
            if isinstance(servicer, AioRounds):  # from the first complete round on: no handshakes
                return servicer.started, c1
            return c0, c1

        c0, c1 = asyncio.run(main())
    if kind == "aio-rounds":
        messages -= 1
    n = 2 * streams * messages
    out = {"user_us_per_message": round((c1[0] - c0[0]) / n * 1e6, 1),
           "kernel_us_per_message": round((c1[1] - c0[1]) / n * 1e6, 1)}
    if kind == "aio-rounds":
        out["cpu_ms_per_round"] = round((c1[0] + c1[1] - c0[0] - c0[1]) / messages * 1e3, 2)
    return out


def make_pki(root: Path) -> Path:
    ca = root / "ca"
    for d in (ca, root / "coordinator", root / "site"):
        d.mkdir(parents=True)
    ca_init(ca)
    ca_server(ca, root / "coordinator", ["localhost", "127.0.0.1"])
    keygen("site", root / "site")
    ca_sign(ca, root / "site" / "tls.csr", root / "site" / "tls.crt")
    (root / "site" / "ca.crt").write_bytes((ca / "ca.crt").read_bytes())
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=3, help="client streams (sites), one process")
    ap.add_argument("--messages", type=int, default=2000, help="ping-pongs per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", action="store_true",
                    help="the floor of a fast round: a connection per site, replies once every site has sent")
    ap.add_argument("--out", default="grpc_transport")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--channel-each", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--tls", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        run_clients(args.target, args.tls, args.streams, args.messages, args.channel_each)
        return
    runs: dict[str, list[dict]] = {"aio-rounds": []} if args.rounds else {"sync": [], "aio": []}
    with tempfile.TemporaryDirectory(prefix="fedsbdt-transport-") as tmp:
        pki = make_pki(Path(tmp))
        for rep in range(args.repeats):
            for kind in runs:
                r = measure(kind, pki, args.streams, args.messages)
                print(f"run {rep + 1}/{args.repeats} {kind}: {r}", flush=True)
                runs[kind].append(r)
    summary = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    for k, s in summary.items():
        s["total_us_per_message"] = round(s["user_us_per_message"] + s["kernel_us_per_message"], 1)
    print(summary)
    from _util import save

    path = save(args.out, {
        "description": ("server CPU per stream message (user, kernel) and per round of grpc.aio answering every "
                        "stream once all streams have sent (a connection per stream)" if args.rounds else
                        "server CPU per stream message (user, kernel) of gRPC's sync thread-pool server and of "
                        "grpc.aio") + ", bidirectional streams with mutual TLS over loopback, 1.1 KB messages",
        "setting": {"streams": args.streams, "messages_per_stream": args.messages, "repeats": args.repeats,
                    "rounds": args.rounds, "grpc": grpc.__version__},
        "summary": summary, "runs": runs})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
