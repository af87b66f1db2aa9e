"""The process's descriptor limit (`ulimit -n`): raised to fit the connections the server is to
take, shared between HTTP and gRPC where its hard limit is lower, and a floor below which
`aclserve serve` does not start (`short_of_descriptors`): under it the start failed wherever its
descriptors ran out, in words that named something else (grpc core aborting, a bare "[Errno 24]
Too many open files", the models folder "cannot be read", a model "not a loadable OM file"). The
shares it fits are descriptor_shares.py's: the model files loaded versions keep open take from
HTTP's cap past the room the reserve leaves them (connections.py asks). Under a limit below 84 the
reserve is LEAST_RESERVE, what one load compiling needs beside the server's own files, taken from the
connections: it was half the limit, 32 under 64, and one compile beside the server took a few of the
descriptors of the refusals lingering (a load, a compile and the folder scan failed EMFILE)."""
from __future__ import annotations

import logging
import resource

from ..descriptor_shares import COMPILE_FILES, LEAST_RESERVE, LOAD_FILES, Shares, share_out

log = logging.getLogger(__name__)

# descriptors kept for model files, loads, compiles, the watcher, logs and threads: at most this, at most half
# the limit, LEAST_RESERVE at least (a fixed 512 left one connection under `ulimit -n` 768 or less; the server
# itself holds ~30, each loaded version one more, each load 2, each compile up to 7: descriptor_shares.py)
FD_RESERVE = 512
LINGER_MAX = 256  # refused connections lingering at once: at most this, at most an eighth of the limit
# The least `aclserve serve` starts with. Measured (2026-12, CPU runtime, gRPC on) with models/ (digits,
# digits_image), three HTTP and three gRPC clients: 30-31 descriptors open at most; it started and
# served from 32, not at 26 (with an .onnx compiling beside them: from 40, not at 32, its process's
# pipes). At 64 the connection caps are 7 per endpoint, the rest left to the server itself (LEAST_RESERVE)
# and refusals lingering.
MIN_DESCRIPTORS = 64
_lingering_cap = LINGER_MAX  # the process's, set with its descriptor limit (_fit_descriptor_limit)


def lingering_cap() -> int:
    """How many refused connections may linger at once (connections.py), for this descriptor limit."""
    return _lingering_cap


def connections_wanted(config) -> tuple[int, int]:
    """(HTTP, gRPC) connections a server config asks for: max_connections for each endpoint it
    listens on (gRPC off: 0)."""
    return config.max_connections, (config.max_connections if config.grpc_port else 0)


def short_of_descriptors(connections_wanted: int) -> str | None:
    """Why the server cannot start under the descriptor limit, if it cannot: the soft limit is
    first raised towards what `connections_wanted` (HTTP's and gRPC's together) need, as far as
    the hard limit lets it; under MIN_DESCRIPTORS after that, one line saying so."""
    _fit_descriptor_limit(connections_wanted)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= MIN_DESCRIPTORS:
        return None
    fits = connections_wanted + LINGER_MAX + FD_RESERVE
    return (f"the descriptor limit is {soft} (ulimit -n{', its hard limit too' if hard == soft else ''}), below the "
            f"{MIN_DESCRIPTORS} that aclserve serve needs at least: raise it (ulimit -n {fits} fits max_connections; "
            "docker run --ulimit nofile=N, systemd LimitNOFILE=N)")


def fit_connection_caps(http_wanted: int, grpc_wanted: int, loads_wanted: int = 1) -> tuple[int, int]:
    """(HTTP's, gRPC's) connection caps: both as wanted when the descriptor limit fits them
    (raised to fit when it can); else what fits, shared in proportion to what each wanted (at
    least one each), warned. gRPC off: grpc_wanted 0. The shares are descriptor_shares.py's from
    then on: model files past their room take from HTTP's, loads past what the reserve fits of
    `loads_wanted` (load_concurrency) wait for their turn, and compiles past what it fits beside
    them for a place, warned."""
    wanted = http_wanted + grpc_wanted
    fitted, soft, reserve = _fit_descriptor_limit(wanted)
    if fitted >= wanted:
        http, grpc = http_wanted, grpc_wanted
    else:
        http = max(1, fitted * http_wanted // wanted)
        grpc = max(1, fitted - http) if grpc_wanted else 0
        log.warning("connections capped at %d for HTTP%s (max_connections %d) to fit the descriptor limit "
                    "of %d (ulimit -n; raise it to serve max_connections)", http,
                    f" and {grpc} for gRPC" if grpc_wanted else "", http_wanted, soft)
    shares = Shares(limit=soft, reserve=reserve, http=http, http_wanted=http_wanted, grpc=grpc,
                    loads_wanted=loads_wanted)
    if shares.loads < loads_wanted:
        log.warning("%s at once %s the descriptor limit of %d (ulimit -n) beside the connections, %d descriptors "
                    "each and %d more for a compile of an .onnx (load_concurrency %d): the others wait for one to "
                    "end", _count(shares.loads, "load"), _fit(shares.loads), soft, LOAD_FILES, COMPILE_FILES,
                    loads_wanted)
    if shares.compiles < shares.loads:
        log.warning("%s of an .onnx at once %s the descriptor limit of %d (ulimit -n) beside the connections, %d "
                    "descriptors each (load_concurrency %d): the others wait for one to end",
                    _count(shares.compiles, "compile"), _fit(shares.compiles), soft, COMPILE_FILES, loads_wanted)
    share_out(shares)
    return http, grpc


def _count(number: int, what: str) -> str:
    return f"one {what}" if number == 1 else f"{number} {what}s"


def _fit(number: int) -> str:
    return "fits" if number == 1 else "fit"


def _fit_descriptor_limit(max_connections: int) -> tuple[int, int, int]:
    """Raise the soft descriptor limit to fit max_connections (+ refusals lingering + a reserve
    for the server's own files and the models'): (the connections that fit, at most
    max_connections; the soft limit; the reserve)."""
    global _lingering_cap
    need = max_connections + LINGER_MAX + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the descriptor limit to %d: %s", target, e)
    if soft != resource.RLIM_INFINITY and soft < need:
        _lingering_cap = min(LINGER_MAX, max(1, soft // 8))
        reserve = max(LEAST_RESERVE, min(FD_RESERVE, soft // 2))
        return max(1, soft - _lingering_cap - reserve), soft, reserve
    _lingering_cap = LINGER_MAX
    return max_connections, soft, FD_RESERVE
