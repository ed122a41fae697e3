"""`podcert signer ca revoke GEN`: revoke a compromised CA generation and replace every live leaf
it signed, then take its root out of the trust bundles.

Order: (1) with `--now`, say first that mutual TLS between pods not yet replaced fails; (2) write
the revocation to the CA Secret (a fresh generation signs at once when GEN was signing); (3) set
`podcert.dev/rotate-before` on every stale pod the shim serves; (4) evict the stale pods on
kubelet nodes through the Eviction API in waves, each wave's pods gone before the next (a 429, a
PodDisruptionBudget saying no, is retried after `--retry-seconds`; as `kubectl drain`, a pod no
controller owns only with `--force`), or with `--wait-refresh` leave them to their kubelet's
next refresh; (5) poll until no live pod chains to GEN, a line per change; (6) when kubelet pods
were refreshed in place, wait `--settle-seconds` (a kubelet writes the new files at the pod's
next sync, after the request says it is done); (7) drop GEN's root from the bundles. On
`--timeout` the root stays trusted (the schedule removes it when its last leaf has surely
expired) and the command fails naming the pods left.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Callable

from podcert.api.times import format_micro_time
from podcert.api.versions import group_version
from podcert.client import eviction
from podcert.client.discovery import certificates_versions
from podcert.client.rest import ApiError, Rest, path_of
from podcert.errors import CommandError
from signer import revokeplan
from signer.authority import revoke
from signer.authority.castore import CAStore, describe
from signer.kube import SignerKube
from signer.leader import SIGNER_NAMES_ANNOTATION

LEASES = "coordination.k8s.io/v1"

# How long a shim pod may stay stale before the command asks its shim again.
REASK = dt.timedelta(seconds=10)
# A kubelet writes a refreshed credential into a running pod's volume at the pod's next sync
# (every minute plus jitter), after the request is issued: the requests say a pod is done before
# its files do.
KUBELET_SYNC = dt.timedelta(seconds=120)


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--now",
        action="store_true",
        help="revoke: take the revoked root out of every trust bundle at once (mutual TLS "
        "between pods not yet replaced then fails)",
    )
    p.add_argument(
        "--wait-refresh",
        action="store_true",
        help="revoke: leave pods on kubelet nodes to their next refresh instead of evicting them",
    )
    p.add_argument(
        "--signer-name",
        dest="revoke_signer_names",
        action="append",
        default=[],
        help="revoke: a pod with a podCertificate volume for this name and no issued request "
        "left to show its leaf's issuer is replaced too (repeatable)",
    )
    p.add_argument("--wave-size", type=int, default=10, help="revoke: pods evicted per wave")
    p.add_argument(
        "--retry-seconds",
        type=float,
        default=5.0,
        help="revoke: wait before asking again for an eviction a disruption budget refused",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="revoke: give up after this many seconds"
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=KUBELET_SYNC.total_seconds(),
        help="revoke: after the last kubelet pod refreshed in place, wait this long before "
        "untrusting the root (a kubelet writes the new credential at the pod's next sync)",
    )


def run(
    args: argparse.Namespace,
    cas: CAStore,
    kube: SignerKube,
    *,
    clock: Callable[[], dt.datetime] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    gid = args.generation or args.id
    if not gid:
        raise CommandError("ca revoke: name the generation (see `podcert signer ca status`)")
    now = clock or (lambda: dt.datetime.now(dt.UTC))
    if args.now:
        print(
            f"--now: {gid}'s root leaves every trust bundle at once; mutual TLS between pods "
            "still holding its leaves fails until they are replaced"
        )
    started = now()
    after = cas.revoke_generation(gid, at_once=args.now)
    print(f"revoked {gid}: {describe(after)}")
    rest = kube.rest
    revoked = [r for r in cas.revoked if r.id == gid]
    names = list(args.revoke_signer_names)
    if not names:
        names, said = _served(rest, cas.namespace, args.lease_name)
        print(f"pods with no request left are judged for the signer names {said}", flush=True)
    stale = _stale(rest, revoked, names)
    print(revokeplan.progress_line(gid, stale, now() - started), flush=True)
    stamp = format_micro_time(now())
    for s in stale:
        if s.replacer == "shim":
            _annotate(rest, s.pod, stamp)
    shim = sum(1 for s in stale if s.replacer == "shim")
    if shim:
        print(f"asked the shim to re-key {shim} pod(s)")
    deadline = started + dt.timedelta(seconds=args.timeout)
    in_place = revokeplan.in_place(stale, wait_refresh=args.wait_refresh, force=args.force)
    if not args.wait_refresh:
        if in_place:
            print(
                f"{len(in_place)} pod(s) on kubelet nodes have no controller: evicting one "
                f"deletes it for good, so they are left to their next refresh (--force evicts "
                f"them): {', '.join(f'{s.pod.namespace}/{s.pod.name}' for s in in_place[:10])}",
                flush=True,
            )
        waves = revokeplan.waves(stale, args.wave_size, force=args.force)
        for n, wave in enumerate(waves, 1):
            refused = 0
            for s in wave:
                refused += eviction.evict(
                    rest,
                    s.pod.namespace,
                    s.pod.name,
                    deadline,
                    now,
                    sleep,
                    args.retry_seconds,
                    s.pod.uid,
                )
            evicted = ", ".join(f"{s.pod.namespace}/{s.pod.name}" for s in wave)
            budget = (
                f" ({refused} refusal(s) by a disruption budget, asked again)" if refused else ""
            )
            print(f"wave {n}: evicted {evicted}{budget}", flush=True)
            _wait_gone(rest, wave, deadline, now, sleep)
    elif any(s.replacer == "kubelet" for s in stale):
        kubelet = sum(1 for s in stale if s.replacer == "kubelet")
        print(
            f"{kubelet} pod(s) on kubelet nodes are left to their next refresh (--wait-refresh): "
            "waiting for them",
            flush=True,
        )
    last, asked = len(stale), now()
    while stale:
        if now() >= deadline:
            left = ", ".join(f"{s.pod.namespace}/{s.pod.name}" for s in stale[:10])
            root = (
                "its root already left every trust bundle (--now): their mutual TLS fails"
                if args.now
                else "its root stays trusted until they are replaced"
            )
            raise CommandError(
                f"ca revoke: {len(stale)} pod(s) still hold leaves of {gid} after "
                f"{args.timeout:.0f}s ({left}); {root}"
            )
        sleep(1.0)
        stale = _stale(rest, revoked, names)
        if now() - asked >= REASK:
            # A replica may have signed once more with the revoked CA before it read the
            # Secret's new version: ask the shim again for what is still stale.
            asked, stamp = now(), format_micro_time(now())
            for s in stale:
                if s.replacer == "shim":
                    _annotate(rest, s.pod, stamp)
        if len(stale) != last:
            print(revokeplan.progress_line(gid, stale, now() - started), flush=True)
            last = len(stale)
    if not args.now and any(g.id == gid for g in cas.generations):
        if in_place and args.settle_seconds > 0:
            print(
                f"{len(in_place)} kubelet pod(s) refreshed in place: waiting "
                f"{args.settle_seconds:.0f}s for their kubelets to write the new credentials "
                "(at each pod's next sync)",
                flush=True,
            )
            sleep(args.settle_seconds)
        cas.untrust(gid)
        print(f"no live leaf chains to {gid}: its root left every trust bundle")
    return 0


def _served(rest: Rest, namespace: str, lease_name: str) -> tuple[list[str], str]:
    """The signer names the leader says it serves (its Lease's annotation), and how to say so;
    none when the Lease cannot be read (then only --signer-name names them)."""
    try:
        lease = rest.request("GET", path_of(LEASES, "leases", namespace, lease_name))
    except ApiError as err:
        return (
            [],
            f"given by --signer-name: none (the Lease {namespace}/{lease_name}: {err.status})",
        )
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    names = [n for n in str(annotations.get(SIGNER_NAMES_ANNOTATION) or "").split(",") if n]
    return names, f"the leader serves: {', '.join(names) or 'none'}"


def _stale(
    rest: Rest, revoked: list[revoke.Revocation], signer_names: list[str]
) -> list[revokeplan.Stale]:
    pods = [
        revokeplan.pod_of(p) for p in rest.request("GET", path_of("v1", "pods")).get("items") or []
    ]
    pcr_version, _ = certificates_versions(rest)
    body = rest.request("GET", path_of(group_version(pcr_version), "podcertificaterequests"))
    issued = [i for i in map(revokeplan.issued_of, body.get("items") or []) if i is not None]
    return revokeplan.stale_pods(pods, issued, revoked, signer_names)


def _wait_gone(
    rest: Rest,
    wave: list[revokeplan.Stale],
    deadline: dt.datetime,
    now: Callable[[], dt.datetime],
    sleep: Callable[[float], None],
) -> None:
    """Wait until each evicted pod is deleted (or replaced by another of its name), as
    `kubectl drain` does, before the next wave: a wave's pods are gone, not just asked to go."""
    left = list(wave)
    while left:
        left = [s for s in left if _still_there(rest, s.pod)]
        if not left or now() >= deadline:
            return
        sleep(0.5)


def _still_there(rest: Rest, pod: revokeplan.Pod) -> bool:
    try:
        found = rest.request("GET", path_of("v1", "pods", pod.namespace, pod.name))
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return str((found.get("metadata") or {}).get("uid", "")) == pod.uid


def _annotate(rest: Rest, pod: revokeplan.Pod, stamp: str) -> None:
    try:
        rest.request(
            "PATCH",
            path_of("v1", "pods", pod.namespace, pod.name),
            body={"metadata": {"annotations": {revokeplan.ROTATE_ANNOTATION: stamp}}},
            content_type="application/merge-patch+json",
        )
    except ApiError as err:
        if err.status != 404:  # a pod gone holds no leaf
            raise
