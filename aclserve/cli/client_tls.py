"""The TLS files of a client command (`infer`, `profile --url`): the CAs it trusts beside the
system's (the file SSL_CERT_FILE names) and the client certificate it shows a server that asks
for one (--cert/--key: mutual TLS). Each is checked before anything is sent, a file that cannot
serve being bad input (UsageError) named by its variable or option: OpenSSL passes over a
trust file it cannot read without a word, and says "PEM lib" of any pair it cannot load."""
from __future__ import annotations

import os
import ssl
import urllib.parse

from .usage import FILE_NAME, UsageError


def add_client_cert_options(parser, applies: str = "") -> None:
    """--cert and --key: the client certificate for a server started with tls_client_ca_file."""
    parser.add_argument("--cert", metavar="FILE", type=FILE_NAME,
                        help="a client certificate (PEM, its key in it too unless --key gives it) for a server that "
                             f"asks for one: mutual TLS{applies}")
    parser.add_argument("--key", metavar="FILE", type=FILE_NAME,
                        help=f"the private key (PEM) of --cert's certificate{applies}")


class _EncryptedKey(Exception):
    pass


def _no_passphrase():
    raise _EncryptedKey  # (OpenSSL would otherwise ask for it on the terminal)


def client_tls(args) -> ssl.SSLContext | None:
    """The TLS context showing --cert (None without it): the system's trust, and SSL_CERT_FILE's,
    as the default context's; UsageError naming what is wrong with the files."""
    if args.key and not args.cert:
        raise UsageError("--key goes with --cert (the certificate it is the key of)")
    https = urllib.parse.urlsplit(args.url).scheme == "https"
    if https:  # (an http:// URL uses no CA: the variable, left set for other programs, is not its business)
        _check_trust_file()
    if not args.cert:
        return None
    if not https:  # (it would go unused, and unsaid)
        raise UsageError("--cert is shown to a TLS server: give an https:// --url")
    context = ssl.create_default_context()
    try:
        context.load_cert_chain(args.cert, args.key, password=_no_passphrase)
    except _EncryptedKey:
        raise UsageError(f"--{'key' if args.key else 'cert'}: the private key is encrypted; give it unencrypted "
                         "(`openssl pkey -in FILE -out FILE2`)") from None
    except ssl.SSLError as e:  # (not PEM, no key in --cert, a key that is not the certificate's)
        raise UsageError(_not_a_pair(args.cert, args.key, e)) from None
    except OSError as e:
        raise UsageError(f"--cert/--key: cannot read {e.filename or args.cert}: {e.strerror or e}") from None
    return context


def _check_trust_file() -> None:
    """UsageError when the CA file named by SSL_CERT_FILE cannot be read or holds no certificate:
    OpenSSL went on without it, and the server's certificate was then "not trusted here"."""
    variable = ssl.get_default_verify_paths().openssl_cafile_env  # (SSL_CERT_FILE)
    path = os.environ.get(variable)
    if not path:
        return
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as e:  # (an OSError too: first)
        raise UsageError(f"{variable} {path} holds no PEM CA certificate ({e.reason or e}): {_SET_IT}") from None
    except OSError as e:
        raise UsageError(f"{variable} {path} cannot be read ({e.strerror or e}): {_SET_IT}") from None


_SET_IT = "set it to a PEM file of the CA certificates to trust, or unset it"


# a PEM file's blocks, as their lines begin and end them
_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = b"PRIVATE KEY-----"  # (PRIVATE KEY, RSA PRIVATE KEY, EC PRIVATE KEY, ...)


def _not_a_pair(cert: str, key: str | None, error: ssl.SSLError) -> str:
    """What is wrong with --cert and --key that OpenSSL refused (its "PEM lib" names neither file):
    the file without its block named, else the pair said as a whole."""
    pair = f"--cert {cert}{f' --key {key}' if key else ''}: not a PEM certificate and its private key"
    if error.reason == "KEY_VALUES_MISMATCH":
        return f"{pair} (the key is not the certificate's)"
    held = _read(cert)
    if _CERTIFICATE not in held:
        if _PRIVATE_KEY in held:
            return (f"--cert {cert} holds a private key, no PEM certificate: "
                    "give it as --key, the certificate's as --cert")
        return f"--cert {cert} holds no PEM certificate"
    if key is None and _PRIVATE_KEY not in held:
        return (f"--cert {cert}: the private key is missing (the file holds no PRIVATE KEY block): give the key's "
                "file as --key FILE, or append the key to the certificate's file")
    if key is not None and _PRIVATE_KEY not in _read(key):
        return f"--key {key} holds no PEM private key"
    return f"{pair}{f' ({error.reason})' if error.reason else ''}"


def _read(path: str) -> bytes:
    """A file OpenSSL has just read (b"" if it is gone since)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
