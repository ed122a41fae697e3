"""Leaf signing with the intermediate's key in SoftHSM2 against in memory, in one run.

    .venv/bin/python -m bench.bench_hsm                  # 300 leaves each way, 3 rounds
    .venv/bin/python -m bench.bench_hsm --leaves 50 --rounds 1   # a smoke

No cluster: the signer's own `certs.sign_leaf` signs the same plans with an in-memory P-256
intermediate and with one made in a fresh SoftHSM2 token (`signer.authority.tokenkeys`), rounds
alternating. This is the signing step alone, the part the token changes; the whole issuance
rate through a cluster is bench_issuance's. Reported per side: leaves per second (wall) and CPU
milliseconds per leaf of this process (`time.process_time`; SoftHSM2 runs in it), the medians
of the rounds, and the ratio token / memory of the rate.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

from podcert.api import keys
from signer import certs, model
from signer.authority import ca, pkcs11uri, tokenkeys
from tests import softhsm


def _rate(issuer: model.IssuingCA, plan: model.LeafPlan, leaves: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(leaves):
        certs.sign_leaf(plan, issuer, certs.random_serial())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return leaves / wall, 1000 * cpu / leaves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leaves", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    now = certs.truncate_to_second(dt.datetime.now(dt.UTC))
    with tempfile.TemporaryDirectory() as workdir:
        tokens = softhsm.make(Path(workdir))
        tokens.init_token("bench")
        os.environ.update(tokens.env)
        session = tokenkeys.TokenSession(
            pkcs11uri.parse("pkcs11:token=bench;object=ca"), softhsm.PIN
        )
        root = ca.new_ca("bench", now)
        sides = {
            "memory": ca.issuing_ca(ca.new_intermediate(root, now)),
            "softhsm2": ca.issuing_ca(ca.new_intermediate(root, now, key=session.generate())),
        }
        plan = model.LeafPlan(
            public_key=keys.generate("ECDSAP256").public_key(),
            spiffe_id="spiffe://cluster.local/ns/bench/sa/default",
            dns_names=(),
            not_before=now,
            not_after=now + dt.timedelta(hours=1),
            begin_refresh_at=now + dt.timedelta(minutes=30),
        )
        found: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, issuer in sides.items():
                found[side].append(_rate(issuer, plan, args.leaves))
        session.close()
    rates = {side: statistics.median(r for r, _ in runs) for side, runs in found.items()}
    for side, runs in found.items():
        cpu = statistics.median(c for _, c in runs)
        print(f"{side:9} {rates[side]:8.0f} leaves/s  {cpu:6.2f} ms CPU/leaf")
    print(f"ratio softhsm2/memory: {rates['softhsm2'] / rates['memory']:.2f}")


if __name__ == "__main__":
    main()
