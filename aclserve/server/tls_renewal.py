"""The TLS pair both endpoints serve, taken again from its files when they change while the server
runs (a certificate renewed by cert-manager in a mounted Secret, by certbot, by hand): no restart.

A thread of its own stats the files every POLL_S (regular_files.stat_identity: the paths, following
their links, since a Kubernetes Secret's update swaps the `..data` link its files point through and
certbot's moves the `live/` links to new files of `archive/`). When they differ from those the
served pair was read at, the files are read into a new pair (tls.load: a new SSLContext, the bytes
gRPC is given), checked as at start (PEM, the key the certificate's, readable) and refused if the
certificate is out of its dates; files changed again while being read wait for the next poll. A
pair taken is said at INFO (who it names, until when); one refused keeps the current pair serving,
said in one WARNING for those files (a renewal being written file by file may be said so half-way:
the next change is read again). HTTP: each new connection starts TLS with the context served then
(guard.py), an established one keeps the pair it was served. gRPC: each port's credentials ask
before each handshake (grpc.dynamic_ssl_server_credentials' fetcher, on grpc core's threads) and
are handed the new pair once. A new context rather than load_cert_chain on the served one: a load
that fails there (a key not the certificate's) leaves that context with no usable pair, every
handshake then failing "no shared cipher" (OpenSSL 3.0), and load_verify_locations adds CAs but
never drops one the renewal replaced.

The served certificate's notAfter is a /metrics gauge; a WARNING says once per certificate, at start
and at each poll, that it expires within EXPIRY_WARNING_S, and once more when it has expired.
Owned by ServerState (state.tls); serve() (app.py) loads it before listening, starts the watch once
listening and closes it at shutdown.
"""
from __future__ import annotations

import logging
import os
import ssl
import threading
import time

from ..cert_dates import Validity, said_out_of_date
from ..config import ConfigError
from ..regular_files import stat_identity
from . import tls
from .exposition import Family, single

log = logging.getLogger(__name__)

# How often the files are stat'd: a kubelet updates a mounted Secret a minute or so after the Secret
# changed, cert-manager renews 30 days before the end; three stats cost microseconds
POLL_S = 10.0
# An alert's usual margin: cert-manager renews 30 days before the end, so a certificate this close
# to it is one whose renewal has not come
EXPIRY_WARNING_S = 14 * 86400.0
EXPIRY_METRIC = "aclserve_tls_certificate_expiry_timestamp_seconds"
EXPIRY_HELP = ("notAfter of the TLS certificate both endpoints serve to new connections, as a Unix time "
               "(taken again from its files when they change): alert on it minus time()")
SOON, EXPIRED = "soon", "expired"


def identity(paths: tuple[str, ...]) -> tuple:
    """Each file's identity as the models folder's files have theirs (regular_files.stat_identity:
    its ctime too, so a renewal copied with its mtime kept, `cp -p`, is seen), None for one that
    cannot be stat'd now."""
    seen = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            seen.append(None)
        else:
            seen.append((st.st_dev, *stat_identity(st)))
    return tuple(seen)


def expiry_stage(dates: Validity | None, now: float) -> str | None:
    """EXPIRED, SOON (within EXPIRY_WARNING_S) or None."""
    if dates is None:
        return None
    left = dates.not_after - now
    return EXPIRED if left <= 0 else SOON if left < EXPIRY_WARNING_S else None


class ServedCertificate:
    """The pair new connections of both endpoints get. load() reads it at start; http_context() is
    read on the loop at each connection, a port's gRPC fetcher on grpc core's threads, check() runs
    on the watch's thread: the pair is swapped whole, as one attribute. close() stops the watch."""

    def __init__(self, config):
        self._config = config
        self._paths = tuple(path for path in (config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
                            if path)
        self._poll_s = POLL_S
        self._pair: tls.Pair | None = None
        self._identity: tuple | None = None  # the files' identity when the served pair was read
        self._refused: tuple | None = None  # the identity of files refused, not read again until they change
        self._refusal_said: tuple | None = None  # the identity of files whose refusal was said (once)
        self._expiry_said: tuple[bytes, str] | None = None  # (certificate, stage) last warned of
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        """The pair at start, once (ConfigError: the start stops). One out of its dates is served,
        said by tls.load_at_start; one expiring soon said here."""
        if self._pair is not None:
            return
        seen = identity(self._paths)
        pair = tls.load_at_start(self._config)
        now = time.time()
        if expiry_stage(pair.dates, now) == EXPIRED:  # (said already)
            self._expiry_said = (pair.certificate, EXPIRED)
        self._pair, self._identity = pair, seen
        self._say_expiry(now)

    def http_context(self) -> ssl.SSLContext:
        """The context a new HTTP connection starts TLS with (load() first)."""
        return self._pair.context

    def grpc_credentials(self):
        """New credentials for one gRPC port (load() first), to be kept while the port is: grpc core
        reaches the fetcher through a bare pointer to them (grpcio's cygrpc takes no reference).
        Each port needs its own: grpc asks the fetcher of each port's credentials before each
        handshake there, and is handed a pair only once."""
        import grpc
        given = [self._pair]

        def fetch():
            pair = self._pair
            if pair is given[0]:
                return None  # unchanged: grpc keeps the pair it has
            given[0] = pair
            return tls.grpc_configuration(pair)
        return grpc.dynamic_ssl_server_credentials(tls.grpc_configuration(given[0]), fetch,
                                                   require_client_authentication=given[0].client_ca is not None)

    def watch(self) -> None:
        """Start polling the files (once loaded; a second call does nothing)."""
        if self._thread is not None or self._pair is None:
            return
        self._thread = threading.Thread(target=self._poll, name="aclserve-tls-renewal", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watch (idempotent): its thread ends at once unless in a read of the files."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(1.0)  # (a read blocked on a network volume: the daemon thread is left to end)

    def families(self, reads) -> list[Family]:
        """ServerMetrics' collector protocol: the served certificate's notAfter (none unloaded or undecoded)."""
        pair = self._pair
        if pair is None or pair.dates is None:
            return []
        return [single("gauge", EXPIRY_METRIC, EXPIRY_HELP, pair.dates.not_after)]

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # the watch goes on: the next poll may read them
                log.exception("checking the TLS files for a renewal failed")

    def check(self, now: float | None = None) -> None:
        """One poll: files changed since the served pair was read (and not those refused last) are
        read and, if they pass, served from now on; then the served certificate's expiry said."""
        seen = identity(self._paths)
        if seen != self._identity and seen != self._refused:
            self._take(seen, time.time() if now is None else now)
        self._say_expiry(now)

    def _take(self, seen: tuple, now: float) -> None:
        refused, waits = None, False
        try:
            pair = tls.load(self._config)
            out_of_date = said_out_of_date(pair.dates, now) if pair.dates is not None else None
            if out_of_date:
                refused = f"tls_cert_file: the certificate {self._config.tls_cert_file} {out_of_date}"
                waits = now < pair.dates.not_before  # read again at each poll, taken once valid
        except ConfigError as e:
            refused = str(e)
        if identity(self._paths) != seen:
            return  # changed while read (a renewal being written): read again at the next poll
        if refused is not None:
            self._refused = None if waits else seen
            if seen != self._refusal_said:
                self._refusal_said = seen
                log.warning("the TLS files changed but are not taken: %s; new connections are served the "
                            "certificate %s until they are mended", refused, self._said(self._pair))
            return
        current = self._pair
        self._identity, self._refused = seen, None
        if (pair.certificate, pair.key, pair.client_ca) == (current.certificate, current.key, current.client_ca):
            return  # the same files written again
        self._pair = pair
        log.info("TLS certificate renewed: new connections of both endpoints are served %s (established ones "
                 "keep the certificate they were served)", self._said(pair))

    def _say_expiry(self, now: float | None = None) -> None:
        pair = self._pair
        stage = expiry_stage(pair.dates, time.time() if now is None else now)
        if stage is None or self._expiry_said == (pair.certificate, stage):
            return
        self._expiry_said = (pair.certificate, stage)
        if stage == SOON:
            log.warning("the TLS certificate %s expires on %s: clients that verify it will refuse every "
                        "connection then; renew its files (taken as they change, no restart needed)",
                        self._config.tls_cert_file, pair.dates.not_after_text)
        else:
            log.warning("the TLS certificate %s expired on %s: clients that verify it refuse every connection; "
                        "renew its files (taken as they change, no restart needed)", self._config.tls_cert_file,
                        pair.dates.not_after_text)

    @staticmethod
    def _said(pair: tls.Pair) -> str:
        dates = pair.dates
        return f"{dates.name}, valid until {dates.not_after_text}" if dates is not None else "(its dates unread)"
