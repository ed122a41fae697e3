"""SPIRE beside the devcluster: a server and an agent for another trust domain, on loopback, to
federate podcert with. Built from modules like the control plane, run like it.

`ensure_spire` builds spire-server and spire-agent, the `tool`s of the module
tests/interop/spire (its go.mod names them, `go get -tool ...@v1.13.3`; its go.sum pins every
module), into the cache, once per content of that module and of the plugin list it keeps
(`devcluster.spire_catalog`: the release's own code, its catalogs holding only the plugins
configured here). cgo is on: the server's SQLite datastore (mattn/go-sqlite3) needs it.

`SpireDomain.start` runs one trust domain: a server (SQLite datastore, in-memory keys, join
token node attestation) with its SPIFFE bundle endpoint (https_spiffe) and `federates_with`
each given trust domain, then an agent attested with a join token that serves the Workload API
on a unix socket, attesting workloads with the unix attestor. `server_config` and
`agent_config` are what docs/SPIRE.md shows.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devcluster import spire_catalog, supervise
from devcluster.build import (
    INTEROP_ROOT,
    BuildError,
    Component,
    Progress,
    _default_progress,
    _run_go,
    cache_root,
    interop_digest,
    module_download,
)

SPIRE_MODULE = "github.com/spiffe/spire"
SPIRE_PROGRAMS = ("spire-server", "spire-agent")
START_TIMEOUT = 120.0  # a cold SQLite migration and the first CA on shared cores


@dataclass(frozen=True)
class Spire:
    server: Path
    agent: Path
    version: str


def spire_version(go_mod: str) -> str:
    """The SPIRE release a tool module's go.mod requires."""
    match = re.search(r"^\s*(?:require\s+)?github\.com/spiffe/spire\s+(v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise BuildError("tests/interop/spire/go.mod requires no github.com/spiffe/spire")
    return match.group(1)


def ensure_spire(progress: Progress | None = None) -> Spire:
    """spire-server and spire-agent, built when the cache lacks them: the release the tool
    module pins, from a copy of its source whose plugin catalogs hold only the plugins the
    devcluster configures (`devcluster.spire_catalog`), both in one `go build` (their shared
    packages compiled once, the two links side by side)."""
    say: Progress = progress or _default_progress
    folder = INTEROP_ROOT / "spire"
    if not (folder / "go.mod").is_file():
        raise BuildError(f"{folder} holds no go.mod (the tests' Go programs live in a checkout)")
    go_mod = (folder / "go.mod").read_text()
    version = spire_version(go_mod)
    digest = f"{interop_digest(folder)}-{spire_catalog.recipe_digest()}"
    paths = {name: cache_root() / "bin" / f"{name}-{version}-{digest}" for name in SPIRE_PROGRAMS}
    if all(path.is_file() for path in paths.values()):
        return Spire(paths["spire-server"], paths["spire-agent"], version)
    component = Component(
        binary="spire",
        module=SPIRE_MODULE,
        version=version,
        package=".",
        replace_version="",
    )
    say(f"building spire-server and spire-agent {version} (tests/interop/spire pins its modules)")
    work = cache_root() / "build" / f"spire-{version}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = Path(module_download(component, folder)["Dir"])  # checked by the tool go.sum
    shutil.copytree(source, work / "spire")
    for path in (work / "spire").rglob("*"):  # the module cache's copies are read-only
        path.chmod(0o755 if path.is_dir() else 0o644)
    (work / "spire").chmod(0o755)
    spire_catalog.trim_catalogs(work / "spire")
    (work / "go.mod").write_text(f"{go_mod.rstrip()}\n\nreplace {SPIRE_MODULE} => ./spire\n")
    shutil.copyfile(folder / "go.sum", work / "go.sum")
    out = work / "out"
    _run_go(
        [
            "build",
            "-v",
            "-mod=readonly",
            "-trimpath",
            "-ldflags=-s -w",
            "-o",
            f"{out}/",
            *(f"{SPIRE_MODULE}/cmd/{name}" for name in SPIRE_PROGRAMS),
        ],
        work,
        component,
        say,
        every=100,
        cgo=True,
    )
    for name, dest in paths.items():
        dest.parent.mkdir(parents=True, exist_ok=True)
        (out / name).replace(dest)
    shutil.rmtree(work, ignore_errors=True)
    return Spire(paths["spire-server"], paths["spire-agent"], version)


# --- configuration (HCL) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Federate:
    """A trust domain SPIRE federates with, through its https_spiffe bundle endpoint."""

    trust_domain: str
    url: str
    endpoint_id: str


def server_config(
    trust_domain: str,
    folder: Path,
    socket: Path,
    port: int,
    bundle_port: int,
    federates_with: Sequence[Federate],
    refresh_hint: str = "10s",
    ca_ttl: str = "24h",
) -> str:
    """spire-server's configuration: loopback only; the bundle endpoint with https_spiffe (the
    server's own SVID, spiffe://<trust domain>/spire/server). `ca_ttl` is its X.509 CA's
    lifetime (a downstream podcert signer needs several times its longest leaf)."""
    federations = "".join(
        f"""
        federates_with "{f.trust_domain}" {{
            bundle_endpoint_url = "{f.url}"
            bundle_endpoint_profile "https_spiffe" {{
                endpoint_spiffe_id = "{f.endpoint_id}"
            }}
        }}"""
        for f in federates_with
    )
    return f"""server {{
    bind_address = "127.0.0.1"
    bind_port = "{port}"
    socket_path = "{socket}"
    trust_domain = "{trust_domain}"
    data_dir = "{folder / "server-data"}"
    log_level = "DEBUG"
    ca_ttl = "{ca_ttl}"
    default_x509_svid_ttl = "1h"
    federation {{
        bundle_endpoint {{
            address = "127.0.0.1"
            port = {bundle_port}
            refresh_hint = "{refresh_hint}"
            profile "https_spiffe" {{}}
        }}{federations}
    }}
}}

plugins {{
    DataStore "sql" {{
        plugin_data {{
            database_type = "sqlite3"
            connection_string = "{folder / "server-data" / "datastore.sqlite3"}"
        }}
    }}
    KeyManager "memory" {{
        plugin_data {{}}
    }}
    NodeAttestor "join_token" {{
        plugin_data {{}}
    }}
}}
"""


def agent_config(
    trust_domain: str, folder: Path, socket: Path, server_port: int, bundle: Path, token: str
) -> str:
    """spire-agent's configuration: a join token, the server's bundle to bootstrap with, and the
    unix workload attestor behind the Workload API socket (with the `unix:path` selector, so
    two programs of one user are told apart)."""
    return f"""agent {{
    data_dir = "{folder / "agent-data"}"
    log_level = "DEBUG"
    server_address = "127.0.0.1"
    server_port = "{server_port}"
    socket_path = "{socket}"
    trust_domain = "{trust_domain}"
    trust_bundle_path = "{bundle}"
    join_token = "{token}"
}}

plugins {{
    NodeAttestor "join_token" {{
        plugin_data {{}}
    }}
    KeyManager "memory" {{
        plugin_data {{}}
    }}
    WorkloadAttestor "unix" {{
        plugin_data {{
            discover_workload_path = true
        }}
    }}
}}
"""


# --- running it ----------------------------------------------------------------------------------


class SpireError(RuntimeError):
    """A SPIRE command failed; the message carries its output."""


@dataclass
class SpireDomain:
    """A running SPIRE trust domain: server, agent, and the commands to administer it."""

    spire: Spire
    trust_domain: str
    folder: Path  # configuration, data and logs
    sockets: Path  # short: a unix socket path must fit in 108 bytes
    server_port: int
    bundle_port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    agent_id: str = ""  # once the agent runs: the parent of workload entries

    @property
    def server_socket(self) -> Path:
        return self.sockets / "server.sock"

    @property
    def workload_api(self) -> str:
        """The agent's Workload API, as go-spiffe's WithAddr takes it."""
        return f"unix://{self.sockets / 'agent.sock'}"

    @property
    def bundle_endpoint(self) -> str:
        return f"https://127.0.0.1:{self.bundle_port}/"

    @property
    def server_id(self) -> str:
        """What SPIRE's bundle endpoint presents (https_spiffe)."""
        return f"spiffe://{self.trust_domain}/spire/server"

    @classmethod
    def start(
        cls,
        spire: Spire,
        trust_domain: str,
        folder: Path,
        federates_with: Sequence[Federate] = (),
        refresh_hint: str = "10s",
        ca_ttl: str = "24h",
    ) -> SpireDomain:
        folder.mkdir(parents=True, exist_ok=True)
        domain = cls(
            spire,
            trust_domain,
            folder,
            Path(tempfile.mkdtemp(prefix="spire-")),
            supervise.free_port(),
            supervise.free_port(),
        )
        config = folder / "server.conf"
        config.write_text(
            server_config(
                trust_domain,
                folder,
                domain.server_socket,
                domain.server_port,
                domain.bundle_port,
                federates_with,
                refresh_hint,
                ca_ttl,
            )
        )
        domain._spawn([str(spire.server), "run", "-config", str(config)], "server")
        supervise.wait_until(
            lambda: domain._ok("healthcheck"),
            time.monotonic() + START_TIMEOUT,
            "spire-server healthy",
            interval=0.5,
            failed=supervise.exited(domain.procs[0], folder / "server.log"),
        )
        return domain

    def start_agent(self, agent_id: str = "agent") -> str:
        """Start the agent with a new join token; returns its SPIFFE ID (entries' parent)."""
        token = self.server("token", "generate", "-spiffeID", self.id(agent_id)).split()[-1]
        bundle = self.folder / "bootstrap.pem"
        bundle.write_text(self.server("bundle", "show", "-format", "pem"))
        config = self.folder / "agent.conf"
        socket = self.sockets / "agent.sock"
        config.write_text(
            agent_config(self.trust_domain, self.folder, socket, self.server_port, bundle, token)
        )
        self._spawn([str(self.spire.agent), "run", "-config", str(config)], "agent")
        supervise.wait_until(
            lambda: self._agent_ok(socket),
            time.monotonic() + START_TIMEOUT,
            "spire-agent healthy",
            interval=0.5,
            failed=supervise.exited(self.procs[-1], self.folder / "agent.log"),
        )
        self.agent_id = self.id(agent_id)
        return self.agent_id

    def id(self, path: str) -> str:
        return f"spiffe://{self.trust_domain}/{path}"

    def server(self, *args: str) -> str:
        """`spire-server <command> <args> -socketPath ...`: its output."""
        return self._run([str(self.spire.server), *args, "-socketPath", str(self.server_socket)])

    def entry(self, parent: str, spiffe_id: str, selector: str, federates_with: str) -> None:
        self.server(
            "entry",
            "create",
            "-parentID",
            parent,
            "-spiffeID",
            spiffe_id,
            "-selector",
            selector,
            "-federatesWith",
            f"spiffe://{federates_with}",
        )

    def set_bundle(self, trust_domain: str, pem: Path) -> None:
        """Hand SPIRE another trust domain's roots out of band (the https_spiffe bootstrap)."""
        self.server(
            "bundle", "set", "-format", "pem", "-id", f"spiffe://{trust_domain}", "-path", str(pem)
        )

    def federated_roots(self, trust_domain: str) -> int:
        """How many roots SPIRE holds for another trust domain now."""
        out = self.server("bundle", "list", "-format", "pem", "-id", f"spiffe://{trust_domain}")
        return out.count("BEGIN CERTIFICATE")

    def stop_server(self) -> None:
        """Stop the server alone (the upstream away); the agent keeps serving what it has."""
        supervise.end(self.procs[0], 15)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            supervise.end(proc, 15)
        shutil.rmtree(self.sockets, ignore_errors=True)

    def _spawn(self, args: list[str], name: str) -> None:
        self.procs.append(supervise.spawn(args, self.folder / f"{name}.log"))

    def _ok(self, *args: str) -> bool:
        try:
            self.server(*args)
        except SpireError:
            return False
        return True

    def _agent_ok(self, socket: Path) -> bool:
        try:
            self._run([str(self.spire.agent), "healthcheck", "-socketPath", str(socket)])
        except SpireError:
            return False
        return True

    def _run(self, args: list[str]) -> str:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise SpireError(f"{' '.join(args[1:3])}: {(done.stderr or done.stdout).strip()}")
        return done.stdout
