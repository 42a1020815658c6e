"""Certificates, bcrypt hashes and web config files for the endpoint-security tests."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import trustme

USER = "prometheus"
PASSWORD = "s3cret-scrape"


def bcrypt_hash(password: str) -> str:
    """A real bcrypt hash at the lowest cost, so tests stay fast."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


@dataclass
class Pki:
    """A test CA with a server certificate for 127.0.0.1, as PEM files in ``directory``."""

    ca: trustme.CA
    directory: Path

    @classmethod
    def create(cls, directory: Path) -> Pki:
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        server.cert_chain_pems[0].write_to_path(str(directory / "server.crt"))
        server.private_key_pem.write_to_path(str(directory / "server.key"))
        ca.cert_pem.write_to_path(str(directory / "ca.crt"))
        return cls(ca, directory)

    def client_context(self, *client_names: str) -> ssl.SSLContext:
        """What a scraper uses: trusts the test CA; presents a client certificate for
        ``client_names`` when given."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if client_names:
            self.ca.issue_cert(*client_names).configure_cert(context)
        return context


def write_web_config(directory: Path, text: str, name: str = "web.yml") -> Path:
    path = directory / name
    path.write_text(text)
    return path
