"""Certificates made in the test with openssl: a CA, a server certificate for 127.0.0.1 /
localhost, and a client certificate, all signed by the CA; PEM files in one folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def _run(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {r.stderr.strip()[-500:]}")


def make_pki(d: Path) -> Path:
    """ca.pem / ca.key, server.pem (PKCS#8 key + certificate, as Kafka's PEM keystore
    takes it), server.crt / server.key, client.crt / client.key, other-ca.pem (a CA that
    signed nothing here)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed here")
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{ca}.key"),
             "-out", str(d / f"{ca}.pem"), "-days", "2", "-subj", f"/CN=cmdare test {ca}")
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who, cn in (("server", "127.0.0.1"), ("client", "cmdare-client")):
        _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr"),
             "-subj", f"/CN={cn}")
        _run("x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-out", str(d / f"{who}.crt"), "-days", "2",
             *(["-extfile", str(ext)] if who == "server" else []))
    # openssl 3 writes PKCS#8 keys ("BEGIN PRIVATE KEY"), which Kafka's PEM keystore reads
    (d / "server.pem").write_text((d / "server.key").read_text() + (d / "server.crt").read_text())
    return d
