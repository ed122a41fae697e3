"""The wheel and the sdist are the product: podcert, signer, kubelet_shim, bundles and audit,
each typed (py.typed), and nothing of the development tree. The base wheel alone, installed
from locks/base.txt into a fresh virtual environment, runs `bundles`; each console command then
runs or says in one line which extra to install, and runs once the `server` extra is in.

Built from a copy of the checkout through setuptools' PEP 517 hooks, so the checkout gains no
build/ or egg-info; the fresh environment installs from the hashed locks, as the image does.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from devcluster import imagecheck
from podcert import __version__, cli
from signer import certs, model
from signer.authority import ca

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = imagecheck.PRODUCT_PACKAGES  # what the image copies, too
DEVELOPMENT = ("devcluster", "examples", "bench", "tests")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Not copied into the build tree: caches, the venv, the devcluster's state, git's objects.
UNCOPIED = shutil.ignore_patterns(
    ".git", ".venv", ".devcluster", "*_cache", "__pycache__", "build", "*.egg-info"
)
TRUST_DOMAIN = "wheel.test"

pytestmark = pytest.mark.timeout(600)


def _build(hook: str, tree: Path, out: Path) -> Path:
    """Run setuptools' PEP 517 `hook` (build_wheel or build_sdist) in `tree`; the file made."""
    code = f"import setuptools.build_meta as b; print(b.{hook}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tree = tmp_path_factory.mktemp("tree") / "podcert"
    shutil.copytree(ROOT, tree, ignore=UNCOPIED)
    out = tmp_path_factory.mktemp("dist")
    return _build("build_wheel", tree, out), _build("build_sdist", tree, out)


def test_the_wheel_holds_the_product_typed_and_nothing_else(built: tuple[Path, Path]) -> None:
    wheel, _ = built
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {*PRODUCT, f"podcert-{__version__}.dist-info"}
    licence = zipfile.ZipFile(wheel).read(f"podcert-{__version__}.dist-info/licenses/LICENSE")
    assert licence == (ROOT / "LICENSE").read_bytes()
    for package in PRODUCT:
        assert f"{package}/py.typed" in names, f"{package} is not marked typed"
        assert f"{package}/__init__.py" in names
    # Every module of the checkout's product packages is in it.
    modules = {str(p.relative_to(ROOT)) for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")}
    assert modules <= set(names)


def test_the_wheels_requirements_are_the_base_and_the_server_extra(
    built: tuple[Path, Path],
) -> None:
    wheel, _ = built
    metadata = zipfile.ZipFile(wheel).read(f"podcert-{__version__}.dist-info/METADATA").decode()
    requires = [
        line.split(": ", 1)[1]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    base = [r for r in requires if "extra ==" not in r]
    server = [r.split(";")[0].strip() for r in requires if 'extra == "server"' in r]
    assert sorted(base) == sorted(PYPROJECT["project"]["dependencies"])
    assert sorted(server) == sorted(PYPROJECT["project"]["optional-dependencies"]["server"])
    assert "Provides-Extra: server" in metadata


def test_the_sdist_holds_the_product_sources_and_no_development_tree(
    built: tuple[Path, Path],
) -> None:
    _, sdist = built
    with tarfile.open(sdist) as archive:
        names = [m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name]
    tops = {name.split("/")[0] for name in names}
    assert {*PRODUCT, "pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} <= tops
    assert tops & set(DEVELOPMENT) == set()
    assert tops <= {
        *PRODUCT,
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "PKG-INFO",
        "setup.cfg",
        "podcert.egg-info",
    }


def _material(folder: Path) -> None:
    """A CA, and a credential bundle each for a server and a client workload, as a pod holds."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    authority = ca.new_ca(TRUST_DOMAIN, now)
    roots = authority.root.public_bytes(serialization.Encoding.PEM)
    for name, account in (("server", "api"), ("client", "web")):
        key = ec.generate_private_key(ec.SECP256R1())
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/{account}",
            dns_names=(),
            not_before=now - dt.timedelta(minutes=1),
            not_after=now + dt.timedelta(hours=1),
            begin_refresh_at=now + dt.timedelta(minutes=30),
        )
        chain = certs.sign_leaf(plan, ca.issuing_ca(authority), certs.random_serial()).encode()
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        (folder / f"{name}.pem").write_bytes(key_pem + chain)
        (folder / f"{name}.pem").chmod(0o600)
    (folder / "trust-bundle.pem").write_bytes(roots)


# Run inside the fresh environment: a mutual TLS handshake between two workloads with
# bundles' contexts, each side authorizing the other inside the handshake.
WORKLOAD = f"""
import socket, sys, threading
from pathlib import Path
from cryptography import x509
import bundles

folder = Path(sys.argv[1])
trust = folder / "trust-bundle.pem"
server = bundles.TLSSource(folder / "server.pem", trust)
client = bundles.TLSSource(folder / "client.pem", trust)
listener = socket.create_server(("127.0.0.1", 0))
seen = []
web = bundles.allow_workloads("shop", "web", trust_domain={TRUST_DOMAIN!r})

def serve():
    conn, _ = listener.accept()
    context = server.server_context(web)
    with context.wrap_socket(conn, server_side=True) as tls:
        seen.append(str(bundles.spiffe_id_of(x509.load_der_x509_certificate(tls.getpeercert(True)))))
        tls.sendall(tls.recv(5))

thread = threading.Thread(target=serve)
thread.start()
context = client.client_context(bundles.allow_ids({{"spiffe://{TRUST_DOMAIN}/ns/shop/sa/api"}}))
with context.wrap_socket(socket.create_connection(listener.getsockname())) as tls:
    tls.sendall(b"hello")
    assert tls.recv(5) == b"hello"
thread.join()
print(seen[0])
"""


def _environment(folder: Path, wheel: Path, *locks: str) -> Path:
    """A virtual environment holding `wheel` and exactly what `locks` pin, checked for broken
    requirements. Made by uv (a dev dependency, as fast as pip is slow here): the wheel and its
    metadata are what pip would install."""
    env = folder / "venv"
    uv = str(Path(sys.executable).parent / "uv")
    python = ["--python", str(env / "bin" / "python")]
    _ok([uv, "venv", "--quiet", "--python", sys.executable, str(env)])
    for lock in locks:
        _ok(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                *python,
                "--require-hashes",
                "-r",
                str(ROOT / "locks" / lock),
            ]
        )
    _ok([uv, "pip", "install", "--quiet", *python, "--no-deps", str(wheel)])
    _ok([uv, "pip", "check", *python])
    return env


@pytest.fixture(scope="module")
def fresh(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base wheel alone: what `pip install podcert` gives a workload."""
    return _environment(tmp_path_factory.mktemp("base"), built[0], "base.txt")


def _ok(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)
    assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"
    return done.stdout


def test_the_base_wheel_alone_runs_a_workloads_mutual_tls(fresh: Path, tmp_path: Path) -> None:
    _material(tmp_path)
    python = str(fresh / "bin" / "python")
    out = _ok([python, "-c", WORKLOAD, str(tmp_path)], cwd=tmp_path)
    assert out.strip() == f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/web"
    # Nothing of the server side came with it, and nothing of the development tree.
    probe = "import importlib.util as u; print([m for m in {!r} if u.find_spec(m)])"
    absent = (*sorted(cli.SERVER_EXTRA_MODULES), *DEVELOPMENT)
    assert _ok([python, "-c", probe.format(absent)], cwd=tmp_path).strip() == "[]"


def _command(env: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(env / "bin" / "podcert"), *argv], capture_output=True, text=True, check=False, cwd=env
    )


def test_every_command_runs_or_names_what_to_install(fresh: Path) -> None:
    assert _command(fresh, "--version").stdout.startswith(f"podcert {__version__} ")
    plugin = [str(fresh / "bin" / "kubectl-podcert"), "--help"]
    assert _ok(plugin).startswith("usage: kubectl podcert ")  # `kubectl podcert ...` finds it
    for name, (module, _) in cli.SUBCOMMANDS.items():
        if module.startswith("podcert."):  # plumbing's own commands need no extra
            assert _command(fresh, name, "--help").returncode == 0, name
            continue
        done = _command(fresh, name, "--help")
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (name, done.stderr)
        wanted = (
            "development tool"
            if module.split(".")[0] in cli.DEVELOPMENT_ONLY
            else "pip install 'podcert[server]'"
        )
        assert wanted in lines[0], (name, lines[0])


def test_with_the_server_extra_every_product_command_runs(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    """The image's install: the wheel and locks/runtime.txt (the base plus the server extra)."""
    env = _environment(tmp_path, built[0], "runtime.txt")
    for name, (module, _) in cli.SUBCOMMANDS.items():
        if module.split(".")[0] in cli.DEVELOPMENT_ONLY:
            continue
        done = _command(env, name, "--help")
        assert done.returncode == 0, (name, done.stderr)
        assert done.stdout.startswith(f"usage: podcert {name}"), (name, done.stdout[:200])
