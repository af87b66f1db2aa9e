"""TLS for both endpoints, from one certificate chain and its private key (the config's
`tls_cert_file` and `tls_key_file`, PEM; both or neither), read when the server starts.

HTTP gets an ssl.SSLContext (TLS 1.2 or later) for its listener, whose handshakes are bounded
by header_timeout_s; gRPC gets grpc.ssl_server_credentials of the same pair. Without TLS a
bearer token (auth.py) crosses the network in the clear: serve it this way, or behind a proxy
that terminates TLS, when the server listens beyond loopback. A file that cannot be read, or a
key that is not the certificate's, stops the start with one line (ConfigError).
"""
from __future__ import annotations

import ssl

from ..config import ConfigError


def enabled(config) -> bool:
    return bool(config.tls_cert_file)


def http_context(config) -> ssl.SSLContext | None:
    """The HTTP listener's context, or None without TLS."""
    if not enabled(config):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except ssl.SSLError as e:  # an OSError too: first
        raise ConfigError("tls_key_file", f"the certificate and key do not make a pair ({e.reason or e})") from None
    except OSError as e:
        raise ConfigError("tls_cert_file", f"cannot read {e.filename or 'the certificate or key'}: "
                                           f"{e.strerror or e}") from None
    return context


def grpc_credentials(config):
    """The gRPC port's credentials, or None without TLS (the pair is checked by http_context:
    both are read before anything starts)."""
    if not enabled(config):
        return None
    import grpc
    pair = []
    for key, path in (("tls_key_file", config.tls_key_file), ("tls_cert_file", config.tls_cert_file)):
        try:
            with open(path, "rb") as f:
                pair.append(f.read())
        except OSError as e:
            raise ConfigError(key, f"cannot read {path}: {e.strerror or e}") from None
    return grpc.ssl_server_credentials([tuple(pair)])
