"""`aclserve serve` refuses an API token no client could send (a control character, a blank at an
end, past a header line's length or gRPC metadata's, not ASCII) or one that is a placeholder left
unexpanded, naming where it came from and never echoing it."""
from __future__ import annotations

import json
import os
import socket

import pytest

from tests.aclserve_command import run_aclserve


# (each said "must be at most 8000 printable characters without blanks at its ends", not which rule it
# broke: a tester, t92)
@pytest.mark.parametrize("where, token, grpc, said", [
    ("config", "s3\tcret", False, "must hold printable characters only, not a control character such as a newline or "
                                  "a tab: no client could send it"),
    ("environment", " s3cret", False, "must not begin or end with a blank, such as a space, a tab or a newline: no "
                                      "client could send it"),
    ("config", "s3cret" * 1500, False, "must be at most 8000 characters, as an HTTP header line holds no more (it has "
                                       "9,000): no client could send it"),  # past aiohttp's 8 KB header line
    ("config", "s3cret" * 1000, True, "for gRPC clients to send it"),
    ("config", "t\u00f6k-s3cret", False, "must be ASCII: HTTP clients send other characters in different encodings"),
    # (a Secret made from a file keeps its last newline: the usual cause, which the refusal now names)
    ("environment", "s3cret\n", False, "must not begin or end with a blank, such as a space, a tab or a newline (it "
                                       "ends in a newline, as a Secret made with `kubectl create secret generic "
                                       "--from-file` from a file"),
], ids=["control character", "blank at its start", "9 KB", "5 KB with gRPC", "not ASCII", "a newline at its end"])
def test_serve_refuses_an_api_token_no_client_could_send(tmp_path, where, token, grpc, said):
    """Such a token answered 401 (or a 400 that quoted it back) to every request it guarded. Over
    HTTP alone a 5 KB token works and is kept (gRPC off); a non-ASCII one is refused there too, as
    Python's clients send it in Latin-1 and curl in UTF-8 (a tester). The refusal names the file
    it came from, as the config loader's do (it named the key alone)."""
    (tmp_path / "c.yaml").write_text(f"api_token: {json.dumps(token)}\n")
    (tmp_path / "models").mkdir()  # (a missing one is refused first)
    args = ["--config", "c.yaml"] if where == "config" else []
    env = dict(os.environ, ACLSERVE_API_TOKEN=token) if where == "environment" else None
    grpc_port = "8001" if grpc else "0"  # (refused before anything binds)
    proc = run_aclserve("serve", "--port", "0", "--grpc-port", grpc_port, "--device", "cpu", *args, cwd=tmp_path,
                        env=env)
    name = "c.yaml: api_token" if where == "config" else "ACLSERVE_API_TOKEN"
    if grpc:  # the token's and grpc_port's: where each came from (test_config_origins.py)
        name, said = "api_token", f"{said} (metadata), or turn gRPC off (grpc_port: 0) (api_token from c.yaml, " \
                                  "grpc_port from --grpc-port)"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "s3cret" not in proc.stderr
    assert f"error: bad configuration: {name}: must" in proc.stderr and said in proc.stderr, proc.stderr


@pytest.mark.parametrize("where, token", [("config", "${ACLSERVE_TOKEN}"), ("config", "$TOKEN"),
                                          ("environment", "$(API_TOKEN)"), ("environment", "${TOKEN}"),
                                          ("replaced", "${ACLSERVE_TOKEN}")])
def test_serve_refuses_a_token_that_is_a_placeholder(tmp_path, where, token):
    """`api_token: ${ACLSERVE_TOKEN}` was the token, as written: the file is not expanded. Refused,
    saying how to give the token; in ACLSERVE_API_TOKEN, a placeholder its setter left (a shell's
    single quotes, a Kubernetes $(NAME) of no variable); a file's, replaced by the variable, too.
    (Its port is taken: a token taken ends the start there, not in a server that serves.)"""
    (tmp_path / "c.yaml").write_text(f"api_token: {json.dumps(token)}\n")
    (tmp_path / "models").mkdir()
    args = [] if where == "environment" else ["--config", "c.yaml"]
    variable = {"environment": token, "replaced": "s3cret"}.get(where)
    env = dict(os.environ, ACLSERVE_API_TOKEN=variable) if variable else None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = run_aclserve("serve", "--port", port, "--grpc-port", "0", "--device", "cpu", *args, cwd=tmp_path,
                            env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "s3cret" not in proc.stderr, proc.stderr
    if where == "environment":
        said = "ACLSERVE_API_TOKEN: is a placeholder such as ${NAME}, $NAME or $(NAME), not expanded by what set it"
    else:
        said = ("c.yaml: api_token: is a placeholder such as ${NAME} or $NAME, taken as written: the config file is "
                "not expanded; give the token in ACLSERVE_API_TOKEN")
    assert f"error: bad configuration: {said}" in proc.stderr, proc.stderr
