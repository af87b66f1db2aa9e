"""TLS for both endpoints, from one certificate chain and its private key (the config's
`tls_cert_file` and `tls_key_file`, PEM; both or neither), read when the server starts.

HTTP gets an ssl.SSLContext (TLS 1.2 or later) for its listener, whose handshakes are bounded
by header_timeout_s; gRPC gets grpc.ssl_server_credentials of the same pair. Without TLS a
bearer token (auth.py) crosses the network in the clear: serve it this way, or behind a proxy
that terminates TLS, when the server listens beyond loopback. A file that cannot be read, one
that is not PEM, an encrypted key (OpenSSL would ask for its passphrase on the terminal, and
grpc cannot take it), or a key that is not the certificate's stops the start with one line
(ConfigError).

With `tls_client_ca_file` (PEM CA certificates) both endpoints ask every client for a
certificate and refuse the handshake of one that shows none, or one no CA of the file signed
(mutual TLS): the connection ends before any request is read. It authenticates the transport
only: the bearer token's rules (auth.py) are the same with it.
"""
from __future__ import annotations

import logging
import ssl

from ..cert_dates import out_of_date
from ..config import ConfigConflict, ConfigError

log = logging.getLogger(__name__)


def enabled(config) -> bool:
    return bool(config.tls_cert_file)


def http_context(config) -> ssl.SSLContext | None:
    """The HTTP listener's context, or None without TLS."""
    if not enabled(config):
        return None
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
    if config.tls_client_ca_file:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca_file)
        except ssl.SSLError as e:  # an OSError too: first
            raise ConfigError("tls_client_ca_file", f"{config.tls_client_ca_file} must hold PEM CA certificates "
                                                    f"({e.reason or e})") from None
        except OSError as e:
            raise ConfigError("tls_client_ca_file", f"cannot read {config.tls_client_ca_file}: "
                                                    f"{e.strerror or e}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    _warn_if_out_of_date(config.tls_cert_file)
    return context


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


def grpc_credentials(config):
    """The gRPC port's credentials, or None without TLS (the pair is checked by http_context:
    both are read before anything starts)."""
    if not enabled(config):
        return None
    import grpc
    cert, key = _read(config)
    if not config.tls_client_ca_file:
        return grpc.ssl_server_credentials([(key, cert)])
    client_ca = _read_file("tls_client_ca_file", config.tls_client_ca_file)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca, require_client_auth=True)


def _read(config) -> tuple[bytes, bytes]:
    """(certificate chain, key) as their files hold them."""
    return _read_file("tls_cert_file", config.tls_cert_file), _read_file("tls_key_file", config.tls_key_file)


def _read_file(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or e}") from None
