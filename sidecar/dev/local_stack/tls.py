"""A throwaway certificate authority and server certificate for the local broker's TLS listener.

Made with the ``openssl`` command line (no Python dependency for it), valid for a few days, for
127.0.0.1 and ``localhost`` only. The CA's private key is deleted once the server certificate is
signed: nothing can be signed with it afterwards, so trusting this CA trusts this one broker.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import LocalStackError

VALID_DAYS = 7


@dataclass(frozen=True)
class TlsFiles:
    """The CA certificate clients trust and the broker's PEM keystore (key, then chain)."""

    ca_file: Path
    keystore: Path

    def exist(self) -> bool:
        return self.ca_file.is_file() and self.keystore.is_file()


def tls_files(directory: Path) -> TlsFiles:
    """Where :func:`make_tls_files` puts its files under ``directory``."""
    return TlsFiles(ca_file=directory / "ca.pem", keystore=directory / "broker-keystore.pem")


def make_tls_files(directory: Path) -> TlsFiles:
    """Create a CA and a server certificate for 127.0.0.1 under ``directory`` (mode 0700)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise LocalStackError(
            "the openssl command is needed to make the local broker's certificate"
        )
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    files = tls_files(directory)
    ca_key, server_key = directory / "ca.key", directory / "server.key"
    csr, server_cert = directory / "server.csr", directory / "server.pem"
    extensions = directory / "server.ext"
    extensions.write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
    )
    days = str(VALID_DAYS)
    steps = [
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", days,
         "-subj", "/CN=ragflow-sidecar local CA",
         "-keyout", str(ca_key), "-out", str(files.ca_file),
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        # -nodes writes an unencrypted PKCS#8 key, the form Kafka's PEM keystore reads.
        [openssl, "req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-subj", "/CN=127.0.0.1",
         "-keyout", str(server_key), "-out", str(csr)],
        [openssl, "x509", "-req", "-in", str(csr), "-CA", str(files.ca_file), "-CAkey", str(ca_key),
         "-CAcreateserial", "-sha256", "-days", days, "-extfile", str(extensions),
         "-out", str(server_cert)],
    ]  # fmt: skip
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise LocalStackError(
                    f"openssl {step[1]} failed making the local certificate: "
                    f"{result.stderr.strip()[-400:]}"
                )
        files.keystore.write_text(server_key.read_text() + server_cert.read_text())
        files.keystore.chmod(0o600)
    finally:
        for scratch in (ca_key, server_key, csr, extensions, directory / "ca.srl"):
            scratch.unlink(missing_ok=True)
    return files
