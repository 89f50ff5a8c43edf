"""The lab's private registry: Docker's registry (Debian's ``docker-registry``) behind TLS.

``umprov lab up --registry`` runs it on the lab network as ``umprov-lab-NAME-registry:5000``,
with a certificate from a CA made for the lab; the lab's inventory hands that CA to the
docker_engine role (``docker_engine_registry_ca_certs``), which installs it where the engine
looks (``/etc/docker/certs.d/HOST:PORT/ca.crt``). So ``umprov deploy --pull`` runs here as on a
fleet with an internal registry: TLS verified against a CA the hosts were given, no
``insecure-registries``. This machine reaches it on a loopback port (``docker push
127.0.0.1:PORT/...``; the engine allows loopback registries without a trusted certificate).
"""

from __future__ import annotations

import datetime
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umprov.errors import EnvironmentProblem
from umprov.paths import write_atomic, write_private
from umprov_lab import data
from umprov_lab.hosts import lab_containers, machine_lock, pick_port
from umprov_lab.layout import (
    LABEL,
    Progress,
    container_name,
    lab_dir,
    network_name,
    quiet,
    write_if_changed,
)

REGISTRY_PORT = 5000
REGISTRY_BINARY = "docker-registry"  # Debian's package of distribution/registry v2
CERT_DAYS = 365


@dataclass
class LabRegistry:
    address: str  # what lab hosts pull from: NAME:5000
    local: str  # what this machine pushes to: 127.0.0.1:PORT
    ca_file: Path
    container: str

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "local": self.local, "ca_file": str(self.ca_file),
                "container": self.container}


def address(name: str) -> str:
    return f"{container_name(name, 'registry')}:{REGISTRY_PORT}"


def _still_valid(path: Path, host: str) -> bool:
    """The certificate exists, names ``host`` and is good for at least another week."""
    from cryptography import x509

    if not path.exists():
        return False
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return host in names.get_values_for_type(x509.DNSName) and left > datetime.timedelta(days=7)


def ensure_tls(directory: Path, host: str) -> bool:
    """A CA and a server certificate for ``host`` (and 127.0.0.1) in ``directory``.
    Returns whether they were (re)made."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_crt, srv_crt = directory / "ca.crt", directory / "server.crt"
    srv_key = directory / "server.key"
    if _still_valid(srv_crt, host) and ca_crt.exists() and srv_key.exists():
        return False
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"umprov lab CA ({host})")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName(host), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    # The CA's key is not kept: nothing else is ever signed with it.
    write_private(srv_key, key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode())
    write_atomic(srv_crt, cert.public_bytes(pem).decode())
    write_atomic(ca_crt, ca.public_bytes(pem).decode())
    return True


def registry_binary() -> str:
    path = shutil.which(REGISTRY_BINARY, path="/usr/bin:/usr/sbin:/usr/local/bin")
    if not path:
        raise EnvironmentProblem(
            "the lab registry needs Docker's registry on this machine: "
            "apt-get install docker-registry"
        )
    return path


def has_registry(client: Any, name: str) -> bool:
    return bool(lab_containers(client, f"{LABEL}={name}", f"{LABEL}.role=registry"))


def ensure_registry(
    client: Any, name: str, image: str, taken: set[int], progress: Progress = quiet
) -> tuple[LabRegistry, list[str]]:
    """The lab's TLS registry, on the lab network and on a loopback port (added to ``taken``)."""
    from docker.errors import NotFound

    changes: list[str] = []
    server = container_name(name, "registry")
    tls_dir = lab_dir(name) / "registry"
    remade = ensure_tls(tls_dir, server)
    if remade:
        changes.append("made the lab registry's CA and certificate")
    config = tls_dir / "config.yml"
    if write_if_changed(config, data.read("registry_config.yml")):
        changes.append(f"wrote {config}")
    try:
        container = client.containers.get(server)
    except NotFound:
        container = None
    if container is not None and remade:
        # A new certificate: the running registry still serves the old one.
        container.remove(force=True)
        container = None
    if container is not None and container.status != "running":
        container.start()
        changes.append(f"started {server}")
    if container is None:
        binary = registry_binary()
        with machine_lock():  # from the probed port to the container holding it
            port = pick_port(client, taken)
            progress(f"serving the lab registry from {server} (127.0.0.1:{port})")
            container = client.containers.run(
                image,
                ["/usr/local/bin/docker-registry", "serve", "/etc/umprov-registry/config.yml"],
                entrypoint=[],
                name=server,
                hostname=server,
                detach=True,
                network=network_name(name),
                labels={LABEL: name, f"{LABEL}.role": "registry", f"{LABEL}.port": str(port)},
                ports={f"{REGISTRY_PORT}/tcp": ("127.0.0.1", port)},
                volumes={
                    binary: {"bind": "/usr/local/bin/docker-registry", "mode": "ro"},
                    str(tls_dir): {"bind": "/etc/umprov-registry", "mode": "ro"},
                    f"{server}-data": {"bind": "/var/lib/registry", "mode": "rw"},
                },
                restart_policy={"Name": "always"},
            )
        changes.append(f"created {server}")
    port = int(container.labels[f"{LABEL}.port"])
    taken.add(port)
    registry = LabRegistry(address=address(name), local=f"127.0.0.1:{port}",
                           ca_file=tls_dir / "ca.crt", container=server)
    return registry, changes
