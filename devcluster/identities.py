"""The devcluster's folder layout and its identities: the CA, the API server's serving
certificate, the admin and control-plane client certificates, and the kubeconfigs that carry them.
Made once per folder; re-pointed at the current port on each start. A node identity can also be
kept as the kubelet keeps its own client certificate, renewed in place (`node_client_files`)."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster import pki


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def node_kubeconfig(self, node: str) -> Path:
        return self.root / "nodes" / f"{node}.kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        return self.root / f"{component}.kubeconfig"

    def node_pki(self, node: str) -> Path:
        """Where a node kept as the kubelet keeps itself holds its client certificates."""
        return self.root / "nodes" / f"{node}-pki"

    def node_files_kubeconfig(self, node: str) -> Path:
        return self.root / "nodes" / f"{node}-files.kubeconfig"


def kubeconfig(server: str, ca_pem: bytes, user: str, creds: dict[str, str]) -> str:
    """A one-cluster, one-user kubeconfig. `creds` is either client cert/key data or a token."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "devcluster",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": user, "context": {"cluster": "devcluster", "user": user}}],
            "current-context": user,
        },
        sort_keys=False,
    )


def cert_creds(pair: pki.KeyPair) -> dict[str, str]:
    return {
        "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
        "client-key-data": base64.b64encode(pair.key_pem).decode(),
    }


def write_pki(paths: Paths, now: dt.datetime) -> None:
    """Create the CA, serving and admin certificates, and the service-account key, once."""
    paths.pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (paths.pki / "ca.crt").exists():
        return
    ca = pki.make_ca("podcert-devcluster-ca", now)
    serving = pki.issue(
        ca,
        "kube-apiserver",
        now,
        server_names=(
            "127.0.0.1",
            "localhost",
            "10.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ),
        client=False,
    )
    admin = pki.issue(ca, "podcert-admin", now, organizations=("system:masters",))
    pki.write_private(paths.pki / "ca.key", ca.key_pem)
    pki.write_private(paths.pki / "apiserver.key", serving.key_pem)
    pki.write_private(paths.pki / "admin.key", admin.key_pem)
    sa_private, sa_public = pki.service_account_key()
    pki.write_private(paths.pki / "sa.key", sa_private)
    (paths.pki / "sa.pub").write_bytes(sa_public)
    (paths.pki / "apiserver.crt").write_bytes(serving.cert_pem)
    (paths.pki / "admin.crt").write_bytes(admin.cert_pem)
    (paths.pki / "ca.crt").write_bytes(ca.cert_pem)


# The identities the bootstrap RBAC expects of the control plane's own clients.
COMPONENT_USERS = {
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kube-scheduler": ("system:kube-scheduler", ()),
}


def write_component_identities(paths: Paths, server: str, now: dt.datetime) -> None:
    """Client certificates (and kubeconfigs) for the controller-manager, the scheduler and the
    API server's own calls to kubelets; made once, re-pointed at the current port each time."""
    ca = load_ca(paths)
    kubelet_client = paths.pki / "apiserver-kubelet-client.crt"
    if not kubelet_client.exists():
        pair = pki.issue(
            ca, "kube-apiserver-kubelet-client", now, organizations=("system:masters",)
        )
        pki.write_private(paths.pki / "apiserver-kubelet-client.key", pair.key_pem)
        kubelet_client.write_bytes(pair.cert_pem)
    for component, (user, groups) in COMPONENT_USERS.items():
        write_client_identity(paths, component, user, groups, server, now)


def write_client_identity(
    paths: Paths,
    component: str,
    user: str,
    groups: tuple[str, ...],
    server: str,
    now: dt.datetime,
) -> Path:
    """A client certificate for `user` (made once, as pki/<component>.crt) and the kubeconfig
    that carries it, pointed at `server`; returns the kubeconfig's path."""
    ca = load_ca(paths)
    cert, key = paths.pki / f"{component}.crt", paths.pki / f"{component}.key"
    if not cert.exists():
        pair = pki.issue(ca, user, now, organizations=groups)
        pki.write_private(key, pair.key_pem)
        cert.write_bytes(pair.cert_pem)
    pair = pki.KeyPair(cert.read_bytes(), key.read_bytes())
    text = kubeconfig(server, ca.cert_pem, user, cert_creds(pair))
    out = paths.component_kubeconfig(component)
    pki.write_private(out, text.encode())
    return out


def load_ca(paths: Paths) -> pki.KeyPair:
    return pki.KeyPair((paths.pki / "ca.crt").read_bytes(), (paths.pki / "ca.key").read_bytes())


def admin_ssl(paths: Paths) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
    ctx.load_cert_chain(str(paths.pki / "admin.crt"), str(paths.pki / "admin.key"))
    return ctx


def node_client_pair(
    paths: Paths, node: str, not_before: dt.datetime, not_after: dt.datetime
) -> pki.KeyPair:
    """A client certificate for node `node` (CN=system:node:<node>, O=system:nodes), signed by
    the cluster's CA, valid exactly from `not_before` to `not_after`: a lifetime of seconds
    makes one the API server refuses (401) once it has passed."""
    ca = load_ca(paths)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # A client certificate only: what the kubelet's certificate manager asks for.
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pki.KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def node_client_files(paths: Paths, node: str, server: str, pair: pki.KeyPair) -> Path:
    """Node `node`'s identity kept as the kubelet keeps its own client certificate: each pair in
    a dated file `kubelet-client-<serial>.pem` (certificate, then key, mode 0600) under
    `paths.node_pki(node)`, `kubelet-client-current.pem` a link to the newest, and a kubeconfig
    that names that link as both client-certificate and client-key. Called again with a new
    pair, it renews in place as the kubelet does: the new file written, then the link swapped
    by a rename, so a reader of the link finds one whole pair or the other. Returns the
    kubeconfig's path."""
    folder = paths.node_pki(node)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    serial = x509.load_pem_x509_certificate(pair.cert_pem).serial_number
    dated = folder / f"kubelet-client-{serial:x}.pem"
    pki.write_private(dated, pair.cert_pem + pair.key_pem)
    current = folder / "kubelet-client-current.pem"
    link = folder / ".kubelet-client-current.pem.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(dated.name)
    link.replace(current)
    out = paths.node_files_kubeconfig(node)
    creds = {"client-certificate": str(current), "client-key": str(current)}
    text = kubeconfig(server, load_ca(paths).cert_pem, f"system:node:{node}", creds)
    pki.write_private(out, text.encode())
    return out
