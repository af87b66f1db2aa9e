"""TLS for both endpoints, from one certificate chain and its private key (the config's
`tls_cert_file` and `tls_key_file`, PEM; both or neither), read when the server starts and again
whenever their files change (tls_renewal.py: the pair each new connection gets).

HTTP gets an ssl.SSLContext (TLS 1.2 or later) for its listener, whose handshakes are bounded
by header_timeout_s; gRPC gets the same pair as grpc's certificate configuration. Without TLS a
bearer token (auth.py) crosses the network in the clear: serve it this way, or behind a proxy
that terminates TLS, when the server listens beyond loopback. A file that cannot be read, one
that is not PEM, an encrypted key (OpenSSL would ask for its passphrase on the terminal, and
grpc cannot take it), or a key that is not the certificate's stops the start with one line
(ConfigError); a renewal of that kind is not taken (tls_renewal.py).

With `tls_client_ca_file` (PEM CA certificates) both endpoints ask every client for a
certificate and refuse the handshake of one that shows none, or one no CA of the file signed
(mutual TLS): the connection ends before any request is read. It authenticates the transport
only: the bearer token's rules (auth.py) are the same with it.
"""
from __future__ import annotations

import logging
import ssl
from typing import NamedTuple

from ..cert_dates import Validity, out_of_date, validity
from ..config import ConfigConflict, ConfigError

log = logging.getLogger(__name__)


class Pair(NamedTuple):
    """One reading of the files: the HTTP listener's context, the bytes gRPC is given (the client
    CAs' None without tls_client_ca_file), and the certificate's dates (None where they cannot be
    decoded: cert_dates.validity)."""
    context: ssl.SSLContext
    certificate: bytes
    key: bytes
    client_ca: bytes | None
    dates: Validity | None


def enabled(config) -> bool:
    return bool(config.tls_cert_file)


def load_at_start(config) -> Pair:
    """The pair the server starts with (load()); one expired or not valid yet is served, with a WARNING."""
    pair = load(config)
    _warn_if_out_of_date(config.tls_cert_file)
    return pair


def load(config) -> Pair:
    """The files read and checked, a new context made of them; ConfigError naming the key at fault."""
    cert, key = _read(config)
    if b"ENCRYPTED" in key:
        raise ConfigError("tls_key_file", f"{config.tls_key_file} is encrypted: give its key unencrypted "
                                          f"(openssl pkey -in KEY -out PLAIN.key), readable by this server only")
    _refuse_not_pem("tls_cert_file", config.tls_cert_file, cert, "CERTIFICATE", "certificate chain")
    _refuse_not_pem("tls_key_file", config.tls_key_file, key, "PRIVATE KEY", "private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file, password=_no_passphrase)
    except ssl.SSLError as e:  # an OSError too: first
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ConfigConflict("tls_key_file", f"{config.tls_key_file} is not the key of the certificate "
                                                 f"{config.tls_cert_file}", ("tls_cert_file", "tls_key_file")) from None
        raise ConfigError("tls_cert_file", f"{config.tls_cert_file} and {config.tls_key_file} must be a PEM "
                                           f"certificate chain and its PEM key ({e.reason or e})") from None
    except OSError as e:
        raise ConfigError("tls_cert_file", f"cannot read {e.filename or 'the certificate or key'}: "
                                           f"{e.strerror or e}") from None
    client_ca = None
    if config.tls_client_ca_file:
        client_ca = _read_file("tls_client_ca_file", config.tls_client_ca_file)
        try:
            context.load_verify_locations(cafile=config.tls_client_ca_file)
        except ssl.SSLError as e:  # an OSError too: first
            raise ConfigError("tls_client_ca_file", f"{config.tls_client_ca_file} must hold PEM CA certificates "
                                                    f"({e.reason or e})") from None
        except OSError as e:
            raise ConfigError("tls_client_ca_file", f"cannot read {config.tls_client_ca_file}: "
                                                    f"{e.strerror or e}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return Pair(context, cert, key, client_ca, validity(config.tls_cert_file))


def _warn_if_out_of_date(cert_file: str, now: float | None = None) -> str | None:
    """Warn (and return why) when the chain's first certificate is expired or not valid yet:
    every client that verifies it then refuses every connection, which the server itself never
    sees. Served all the same (the operator may mean it)."""
    why = out_of_date(cert_file, now)
    if why:
        log.warning("the TLS certificate %s %s: clients that verify it refuse every connection", cert_file, why)
    return why


def _refuse_not_pem(key: str, path: str, held: bytes, label: str, what: str) -> None:
    """A file empty or without its PEM block is named by its own key: OpenSSL's "PEM lib" does not
    say which of the pair it was (an empty tls_key_file was said under tls_cert_file, a tester found)."""
    if not held.strip():
        raise ConfigError(key, f"{path} is empty: it must be a PEM {what}")
    if b"-----BEGIN " not in held or f"{label}-----".encode() not in held:
        raise ConfigError(key, f"{path} must be a PEM {what}: it holds no {label} block")


def _no_passphrase() -> bytes:
    """Never prompt on the terminal for a key's passphrase (a PEM key OpenSSL finds encrypted)."""
    raise ConfigError("tls_key_file", "is encrypted: give its key unencrypted")


def grpc_configuration(pair: Pair):
    """The pair as grpc's certificate configuration (grpc imported only with the gRPC endpoint on)."""
    import grpc
    return grpc.ssl_server_certificate_configuration([(pair.key, pair.certificate)], root_certificates=pair.client_ca)


def _read(config) -> tuple[bytes, bytes]:
    """(certificate chain, key) as their files hold them."""
    return _read_file("tls_cert_file", config.tls_cert_file), _read_file("tls_key_file", config.tls_key_file)


def _read_file(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or e}") from None
