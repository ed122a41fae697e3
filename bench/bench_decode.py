"""Client CPU to read PodCertificateRequests off the wire, as the signer reads them.

    .venv/bin/python -m bench.bench_decode                    # this tree, 5 rounds
    .venv/bin/python -m bench.bench_decode --tree /tmp/old    # also another checkout,
        # (git archive <commit> | tar -x -C /tmp/old), rounds alternating between the two

No cluster: each measurement runs in a fresh interpreter whose `podcert` and `signer` come from
the tree measured, and drives that tree's own adapter code over the same bytes:

- list: a list page of `--requests` pending requests (as kube-apiserver 1.37 writes them, with
  managedFields) read through `podcert.client.pages` in 16 KiB pieces with the tree's request
  shape, then each request made ready to decide (the typed request as stored; before it, the
  dict the store held and `signer.objects.request_from`);
- watch: as many watch event lines of Issued requests (the signer's own status writes coming
  back, most of what its watch carries), each decoded as `Rest.watch` does and asked for its
  outcome, as the controller does to drop it.

The figure is `time.process_time` per request, the median of `--repeat` passes in each round.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PIECE = 16 * 1024


def request(i: int, *, issued: bool) -> dict[str, Any]:
    """A request as the API server returns it (sizes as measured on 1.37.2)."""
    name = f"api-{i:05d}-x7k2p"
    stub = base64.b64encode(os.urandom(400)).decode()  # a P-256 stub CSR is ~200 B, RSA ~700
    obj: dict[str, Any] = {
        "kind": "PodCertificateRequest",
        "apiVersion": "certificates.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"3f1c0a52-1d2e-4b7a-9c1e-{i:012d}",
            "resourceVersion": str(100000 + i),
            "generation": 1,
            "creationTimestamp": "2026-12-03T10:00:00Z",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": f"api-{i:05d}", "uid": "u" * 36}
            ],
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "certificates.k8s.io/v1",
                    "time": "2026-12-03T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:spec": {f"f:{k}": {} for k in ("podName", "podUID", "nodeName")}
                    },
                }
            ],
        },
        "spec": {
            "signerName": "podcert.dev/bench",
            "podName": f"api-{i:05d}",
            "podUID": f"pod-uid-{i:05d}",
            "serviceAccountName": "default",
            "serviceAccountUID": "sa-uid",
            "nodeName": f"node-{i % 2}",
            "nodeUID": f"node-uid-{i % 2}",
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": stub,
        },
        "status": {},
    }
    if issued:
        obj["status"] = {
            "conditions": [
                {
                    "type": "Issued",
                    "status": "True",
                    "reason": "Issued",
                    "message": "issued for spiffe://cluster.local/ns/bench/sa/default",
                    "lastTransitionTime": "2026-12-03T10:00:01Z",
                    "observedGeneration": 1,
                }
            ],
            "certificateChain": "-----BEGIN CERTIFICATE-----\n" + "A" * 1400 + "\n-----END",
            "notBefore": "2026-12-03T09:59:00Z",
            "notAfter": "2026-12-04T10:00:00Z",
            "beginRefreshAt": "2026-12-03T22:00:00Z",
        }
    return obj


def measure(count: int, repeat: int) -> dict[str, float]:
    """In this interpreter, with whichever podcert and signer it imports: CPU microseconds per
    request to list and to watch."""
    import msgspec

    from podcert.client import pages, rest
    from signer import kube

    page = json.dumps(
        {
            "kind": "PodCertificateRequestList",
            "metadata": {"resourceVersion": "99"},
            "items": [request(i, issued=False) for i in range(count)],
        },
        separators=(",", ":"),
    ).encode()
    lines = [
        json.dumps({"type": "MODIFIED", "object": request(i, issued=True)}).encode()
        for i in range(count)
    ]
    event = msgspec.json.Decoder(rest._Event)
    if hasattr(kube, "REQUESTS"):  # one typed request, decoded at the wire
        shape: Any = kube.REQUESTS

        def ready(obj: Any) -> Any:
            return obj

        def settled(obj: Any) -> bool:
            return obj.status.outcome is not None

        def watched(raw: bytes) -> Any:
            return shape.element(raw, "object")

    else:  # the shape, the dict the store held, and the model copied from it
        from signer import objects

        shape = rest._shapes(kube._Request)
        objects_decoder = msgspec.json.Decoder(kube._Request)

        def ready(obj: Any) -> Any:
            return objects.request_from(kube._request(obj))

        def settled(obj: Any) -> bool:
            return objects.outcome(obj) is not None

        def watched(raw: bytes) -> Any:
            return kube._request(objects_decoder.decode(raw))

    def pieces() -> Iterator[bytes]:
        for at in range(0, len(page), PIECE):
            yield page[at : at + PIECE]

    def list_once() -> None:
        for obj in pages.Page(pieces(), shape):
            ready(obj)

    def watch_once() -> None:
        for line in lines:
            settled(watched(event.decode(line).object))

    def per_request(run: Callable[[], None]) -> float:
        run()  # warm
        times = []
        for _ in range(repeat):
            start = time.process_time()
            run()
            times.append(time.process_time() - start)
        return statistics.median(times) / count * 1e6

    return {"list_us": per_request(list_once), "watch_us": per_request(watch_once)}


def one(tree: Path, count: int, repeat: int) -> dict[str, float]:
    """`measure` in a fresh interpreter importing podcert and signer from `tree`."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "import podcert, signer; "
        "assert podcert.__file__.startswith(sys.argv[1]), podcert.__file__; "
        "sys.path.insert(0, sys.argv[2]); from bench.bench_decode import measure; "
        "print(json.dumps(measure(int(sys.argv[3]), int(sys.argv[4]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tree), str(REPO), str(count), str(repeat)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={**os.environ, "PYTHONPATH": ""},
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="a list page's worth")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", type=Path, help="another checkout to compare with")
    args = parser.parse_args(argv)
    trees = {"this tree": REPO} | ({str(args.tree): args.tree.resolve()} if args.tree else {})
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        order = list(trees.items())
        if round_ % 2:
            order.reverse()
        for name, tree in order:
            got = one(tree, args.requests, args.repeat)
            results[name].append(got)
            print(f"round {round_ + 1} {name}: {got}", file=sys.stderr)
    print("| tree | list us/request | watch us/request |")
    print("|---|---:|---:|")
    for name, rows in results.items():
        list_us = statistics.median(r["list_us"] for r in rows)
        watch_us = statistics.median(r["watch_us"] for r in rows)
        print(f"| {name} | {list_us:.1f} | {watch_us:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
