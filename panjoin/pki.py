"""A private CA and one node certificate, for a test or an emulated cluster.

Real deployments bring their own certificates (README, "Security"); a test suite or a
benchmark whose processes talk TLS off loopback needs a throwaway set: an EC CA, and a
certificate it signs for every name and IP the nodes use, good for both ends of
mutual TLS (server and client auth), plus a token file for the manager::

    >>> import tempfile                                                   # doctest: +SKIP
    >>> sec = make_pki(tempfile.mkdtemp(), ips=["10.77.0.2", "10.77.0.3"])  # doctest: +SKIP
    >>> sec.argv()          # ['--tls-cert', '.../cert.pem', '--tls-key', ..., '--tls-ca', ...]

Needs the ``cryptography`` package (the ``test`` extra). Certificates are valid from
a day ago to a day ahead: for tests and benchmarks only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets

from panjoin.security import Security


def new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def pem(obj) -> bytes:
    """A certificate's or a private key's PEM bytes."""
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "public_bytes"):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def certificate(subject: str, key, issuer=None, issuer_key=None,
                ips: tuple[str, ...] = ("127.0.0.1",), dns: tuple[str, ...] = ("localhost",)):
    """A CA (no ``issuer``) or a certificate for ``ips`` and ``dns`` names signed by
    ``issuer``, for server and client authentication."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name)
         .issuer_name(issuer.subject if issuer else name).public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=1)))
    if issuer is None:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        b = b.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        return b.sign(key, hashes.SHA256())
    b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    b = b.add_extension(x509.SubjectAlternativeName(
        [*(x509.DNSName(d) for d in dns),
         *(x509.IPAddress(ipaddress.ip_address(a)) for a in ips)]), critical=False)
    b = b.add_extension(x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(directory: str, ips=("127.0.0.1",), dns=("localhost",), prefix: str = "",
             subject: str = "panjoin") -> Security:
    """Write ``{prefix}ca.pem``, ``{prefix}cert.pem``, ``{prefix}key.pem`` (a node
    certificate for ``ips`` and ``dns``) and ``{prefix}token`` into ``directory``;
    returns the settings that use them all (what every process of a cluster gets)."""
    ca_key, key = new_key(), new_key()
    ca = certificate(f"{subject} CA", ca_key)
    cert = certificate(f"{subject} node", key, ca, ca_key, tuple(ips), tuple(dns))
    paths = {}
    for name, obj in (("ca", ca), ("cert", cert), ("key", key)):
        paths[name] = os.path.join(directory, f"{prefix}{name}.pem")
        with open(paths[name], "wb") as f:
            f.write(pem(obj))
    token = os.path.join(directory, f"{prefix}token")
    with open(token, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return Security(paths["cert"], paths["key"], paths["ca"], token)
