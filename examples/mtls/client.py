"""The example client: steady HTTPS requests with a client certificate, counting every outcome.

    python -m examples.mtls.client --credential-bundle /var/run/identity/credentialbundle.pem \
        --trust-bundle /var/run/identity/trust-bundle.pem \
        --server-id spiffe://cluster.local/ns/shop/sa/api \
        --url https://api.shop.svc:8443/ --rate 50 --duration 60

Rotation without a restart: requests go through `bundles.aiohttp.AuthorizingSession`, which
passes the TLSSource's current client context as `ssl=`; aiohttp keys its connection pool by that
context, so after a rotation new connections use the new material while requests already in
flight finish on the old ones.

The server's identity is its SPIFFE ID, judged inside the TLS handshake by the source's client
context (`bundles.handshake`), so a server that is not allowed never receives a byte of the
request; aiohttp reports it as a certificate error carrying the reason (hostname checks are off:
a pod certificate names a workload, not a host).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import aiohttp

from bundles.aiohttp import AuthorizingSession
from bundles.authz import Authorizer
from bundles.source import SourceError, TLSSource
from examples.mtls import (
    add_credential_arguments,
    add_peer_arguments,
    authorizer_from,
    credential_paths,
    federated_paths,
    setup_logging,
    stop_on_signals,
)

log = logging.getLogger("examples.mtls.client")


class IdentityClient:
    """Calls the identity server; counts successes, failures and the server serials it saw."""

    def __init__(self, source: TLSSource, authorizer: Authorizer, url: str) -> None:
        self.source = source
        self.url = url
        self.ok = 0
        self.failed = 0
        self.errors: Counter[str] = Counter()
        # Server leaf serials in the order first seen: shows the server rotating.
        self.server_serials: Counter[str] = Counter()
        self.last: dict[str, Any] | None = None
        self._authorizer = authorizer
        self._session: AuthorizingSession | None = None
        self._open = contextlib.AsyncExitStack()

    async def __aenter__(self) -> IdentityClient:
        # Idle connections are dropped soon, so connections made with old material age out.
        connector = aiohttp.TCPConnector(keepalive_timeout=5)
        session = AuthorizingSession(
            self.source,
            self._authorizer,
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=10),
        )
        self._session = await self._open.enter_async_context(session)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._session = None
        await self._open.aclose()

    async def request(self) -> dict[str, Any] | None:
        """One request; the answer, or None after counting and logging the failure."""
        if self._session is None:
            raise RuntimeError("use `async with IdentityClient(...)`")
        try:
            async with self._session.get(self.url) as response:
                text = await response.text()
                if response.status != 200:
                    raise aiohttp.ClientResponseError(
                        response.request_info,
                        response.history,
                        status=response.status,
                        message=text.strip(),
                    )
                answer: dict[str, Any] = json.loads(text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.failed += 1
            reason = f"{type(exc).__name__}: {exc}"
            if not self.errors[reason]:
                log.warning("request failed: %s", reason)
            self.errors[reason] += 1
            return None
        self.ok += 1
        self.server_serials[str(answer.get("server_serial"))] += 1
        self.last = answer
        return answer

    async def run(
        self, rate: float, duration: float | None, stop: asyncio.Event | None = None
    ) -> None:
        """Start `rate` requests a second until `duration` seconds pass or `stop` is set.

        Requests start on a fixed schedule, each in its own task, so a slow one never delays
        the next; all of them have finished when this returns.
        """
        if rate <= 0:
            raise ValueError("rate must be positive")
        stop = stop or asyncio.Event()
        period, started = 1.0 / rate, time.monotonic()
        tasks: set[asyncio.Task[dict[str, Any] | None]] = set()
        sent = 0
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if duration is not None and elapsed >= duration:
                break
            task = asyncio.create_task(self.request())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
            # Wait for the next slot on the schedule, or for stop, whichever comes first.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, started + sent * period - time.monotonic())):
                    await stop.wait()
        if tasks:
            await asyncio.gather(*tasks)

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.ok + self.failed,
            "ok": self.ok,
            "failed": self.failed,
            "server_serials": list(self.server_serials),
            "errors": dict(self.errors),
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mtls.client", description=__doc__)
    add_credential_arguments(parser)
    add_peer_arguments(parser, "server", "servers")
    parser.add_argument("--url", required=True, help="e.g. https://127.0.0.1:8443/")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds to run (default: until SIGTERM)"
    )
    args = parser.parse_args(argv)
    credential = credential_paths(parser, args)
    rules = authorizer_from(parser, args)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    setup_logging(args.log_level)
    try:
        source = TLSSource(credential, args.trust_bundle, federated=federated_paths(parser, args))
        authorizer = rules(source.trust_domain)
    except (SourceError, ValueError) as exc:
        log.error("%s", exc)
        return 1
    return asyncio.run(_run(IdentityClient(source, authorizer, args.url), args))


async def _run(client: IdentityClient, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    watcher = asyncio.create_task(client.source.watch(stop, interval=args.reload_interval))
    try:
        async with client:
            await client.run(args.rate, args.duration, stop)
    finally:
        stop.set()
        await watcher
    json.dump(client.stats(), sys.stdout)
    sys.stdout.write("\n")
    return 0 if client.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
