"""`podcert signer ca status`: a line per generation in the Secret, the one awaiting its signed
chain, the next step due, and each revocation, read from a CA store and never written."""

from __future__ import annotations

import datetime as dt
from typing import cast

from signer.authority import castatus, schedule
from signer.authority.castore import CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube
from tests.unit.test_signer_offline import NOW, TD


def store() -> tuple[CAStore, SecretKube]:
    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    return cas, kube


def test_a_new_ca_shows_its_one_generation_active_and_nothing_due() -> None:
    cas, _ = store()
    [gen] = cas.generations

    lines = castatus.report(cas, cas.generations, NOW)

    assert lines[0].startswith(f"{gen.id:24} active")
    assert f"root until {gen.root.not_valid_after_utc:%Y-%m-%d}" in lines[0]
    assert lines[1:] == ["next step due: none"]


def test_a_generation_awaiting_its_chain_names_the_import_command() -> None:
    cas, _ = store()
    waiting = cas.prepare_offline(TD)

    lines = castatus.report(cas, cas.generations, NOW)

    [line] = [line for line in lines if line.startswith(waiting.id)]
    assert "awaiting signed chain" in line
    assert f"CSR for spiffe://{TD}" in line
    assert f"`ca import --id {waiting.id} --chain FILE`" in line


def test_a_revoked_generation_says_whether_its_root_is_still_trusted() -> None:
    cas, _ = store()
    [old] = cas.generations
    cas.step(schedule.Prepare())
    new = next(g for g in cas.generations if g.id != old.id)
    cas.step(schedule.Activate(new.id))

    cas.revoke_generation(old.id, at_once=False)
    lines = castatus.report(cas, cas.generations, NOW + dt.timedelta(minutes=1))

    assert lines[-1].startswith(f"revoked: {old.id} at ")
    assert lines[-1].endswith("(root still trusted)")
