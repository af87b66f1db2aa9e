"""A README snippet that starts `aclserve serve` in the background waits, bounded, until that server
is ready before it sends anything: the token, TLS and perf_analyzer snippets slept 5 s, and a server
that took longer to listen on a loaded machine left the first `curl -s` printing nothing, silently
(tester t69). A bounded loop ends by itself when the server died."""
from __future__ import annotations

import re

from tests import REPO

BASH_BLOCK = re.compile(r"^[ \t]*```bash\n(.*?)^[ \t]*```", re.S | re.M)
BACKGROUND_SERVE = re.compile(r"\baclserve serve\b(?P<options>[^&#]*)&(?!&)")
READINESS_LOOP = re.compile(r"^for i in \$\(seq \d+\); do curl -sf (?P<options>.*?)(?P<scheme>https://)?"
                            r"(?:localhost|127\.0\.0\.1):(?P<port>\d+)/v2/health/ready >/dev/null && break; "
                            r"sleep [\d.]+; done(?:\s+#.*)?$")
FIXED_SLEEP = re.compile(r"(?:^|[;&]\s*)sleep \d+(?:\s*[;#]|\s*$)")


def commands(block: str) -> list[str]:
    """The block's command lines, a line continued with a backslash joined to the next."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.strip() for line in joined.splitlines() if line.strip()]


def server_snippets() -> list[list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [commands(m.group(1)) for m in BASH_BLOCK.finditer(text)]
    return [lines for lines in blocks if any(BACKGROUND_SERVE.search(line) for line in lines)]


def test_the_readme_has_the_snippets_this_checks():
    assert len(server_snippets()) >= 3  # token, TLS, perf_analyzer


def test_a_snippet_starting_a_server_waits_for_it_to_be_ready_and_bounded():
    for lines in server_snippets():
        (at,) = [i for i, line in enumerate(lines) if BACKGROUND_SERVE.search(line)]
        options = BACKGROUND_SERVE.search(lines[at]).group("options")
        port = re.search(r"--port (\d+)", options)
        wait = READINESS_LOOP.match(lines[at + 1])
        assert wait, f"after {lines[at]!r} comes {lines[at + 1]!r}, not a bounded wait for readiness"
        assert wait.group("port") == (port.group(1) if port else "8000"), lines[at + 1]
        if "--tls-cert" in options:  # its HTTPS, with the client certificate a --tls-client-ca asks for
            assert wait.group("scheme") and "--cacert" in wait.group("options"), lines[at + 1]
            assert "--tls-client-ca" not in options or "--cert" in wait.group("options"), lines[at + 1]
        assert not [line for line in lines if FIXED_SLEEP.search(line)], lines
