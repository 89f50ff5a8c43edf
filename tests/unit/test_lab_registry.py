"""The lab registry's TLS material and what the lab inventory hands the docker_engine role."""

from __future__ import annotations

import ssl
from pathlib import Path

import yaml

from umprov_lab import registry
from umprov_lab.hosts import LabHost
from umprov_lab.inventory import render_inventory


def test_tls_material_verifies_for_the_registry_name(tmp_path: Path) -> None:
    from cryptography import x509

    host = "umprov-lab-t-registry"
    folder = tmp_path / "registry"
    assert registry.ensure_tls(folder, host) is True
    assert registry.ensure_tls(folder, host) is False  # kept while valid
    assert oct((folder / "server.key").stat().st_mode & 0o777) == "0o600"
    assert not list(folder.glob("ca.key*"))  # the CA's key is never written
    cert = x509.load_pem_x509_certificate((folder / "server.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [host]
    # What a TLS client does with the CA: the chain and the name check out.
    context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    assert context.cert_store_stats()["x509_ca"] == 1
    # Another name: remade.
    assert registry.ensure_tls(folder, "umprov-lab-u-registry") is True


def test_inventory_gives_the_hosts_the_registry_ca(tmp_path: Path) -> None:
    registry.ensure_tls(tmp_path, "umprov-lab-t-registry")
    reg = registry.LabRegistry("umprov-lab-t-registry:5000", "127.0.0.1:22250",
                               tmp_path / "ca.crt", "umprov-lab-t-registry")
    hosts = [LabHost("lab-t-1", "umprov-lab-t-1", 22201, "running")]
    text = render_inventory("t", hosts, tmp_path / "key", tmp_path / "kh", reg)
    group_vars = yaml.safe_load(text)["all"]["children"]["gpu_hosts"]["vars"]
    certs = group_vars["docker_engine_registry_ca_certs"]
    assert certs == [{"registry": "umprov-lab-t-registry:5000",
                      "certificate": (tmp_path / "ca.crt").read_text()}]
    plain = render_inventory("t", hosts, tmp_path / "key", tmp_path / "kh")
    assert "docker_engine_registry_ca_certs" not in plain
