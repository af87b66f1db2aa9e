"""Stand-ins for what is not a KServe server (a gRPC port, HTML, a server that never answers):
accepts connections on 127.0.0.1, reads each request's head and answers canned bytes; a
plain web server (web_server); and a server that notes what reaches it (recording_server)."""
from __future__ import annotations

import contextlib
import socket
import threading


@contextlib.contextmanager
def canned_server(answer: bytes | None):
    """Yields the server's URL; `answer` None: the connection is held and never answered."""
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            held.append(conn)
            with contextlib.suppress(OSError):
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                if answer is not None:
                    conn.sendall(answer)
                    # the end of the answer, then what is left of the request read until the client
                    # closes: closed with it unread, the kernel resets the connection, and the client
                    # could lose the answer to it ("broke off the exchange" under load)
                    conn.shutdown(socket.SHUT_WR)
                    conn.settimeout(30)  # (a hang guard)
                    while conn.recv(65536):
                        pass
                    conn.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        # (close alone does not wake the thread's accept(); shutdown does, at once, where the
        # join waited out its 5 s in every test)
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for conn in held:
            conn.close()
        thread.join(5)


@contextlib.contextmanager
def _in_a_thread(server):
    """`server` (http.server's, on 127.0.0.1) serving in a thread; yields its URL, and shuts it down."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def web_server(folder):
    """`python -m http.server` on 127.0.0.1, serving `folder`, in a thread: a plain web server
    (404 HTML pages, 501 to a POST). Yields its URL."""
    import functools
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    with _in_a_thread(server) as url:
        yield url


@contextlib.contextmanager
def recording_server():
    """A server on 127.0.0.1 answering 404 to every GET and POST, noting each as (method, path,
    its Authorization header): where a redirect points, to see that nothing reaches it. Yields
    (its URL, the list of what reached it)."""
    import http.server

    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.command, self.path, self.headers.get("Authorization")))
            self.send_error(404)
        do_POST = do_GET

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    with _in_a_thread(server) as url:
        yield url, seen


def redirect_to(location: str, status: int = 302) -> bytes:
    """A canned answer redirecting to `location`."""
    return (b"HTTP/1.1 %d Redirect\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            % (status, location.encode()))


@contextlib.contextmanager
def stalling_kserve_server(trace_dir):
    """A KServe stand-in on 127.0.0.1 for `aclserve profile --url`: model `digits`'s metadata,
    config and trace settings, and its first infer request, answered; every later infer request
    held unanswered (a server at a standstill) until the context ends. Tracing turned off writes an
    empty Chrome trace, profile-digits.json, in `trace_dir`, as a server writes its traced requests.
    The trace settings asked for after the run are refused once each, as a server at its
    max_connections refuses a connection: turning tracing off closed unanswered, the put-back 503.
    Yields (its URL, the infer requests that reached it, the trace settings asked for)."""
    import http.server
    import json
    import os

    released = threading.Event()
    infers, settings = [], []

    class StandIn(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # (keep-alive: a client's connection serves its next request)

        def _answer(self, doc) -> None:
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._answer({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]}
                         if self.path == "/v2/models/digits" else
                         {"max_batch_size": 8} if self.path.endswith("/config") else {})

        def do_POST(self):
            sent = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}") \
                if self.path.endswith("/setting") else self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.endswith("/infer"):
                infers.append(self.path)
                if len(infers) > 1:
                    released.wait(60)  # (a hang guard: the context's end releases it)
                    return
            else:
                settings.append(sent)
                off = settings.index({"trace_level": ["OFF"]}) if {"trace_level": ["OFF"]} in settings else None
                if off == len(settings) - 1 and settings.count(sent) == 1:  # (the first OFF: closed unanswered)
                    self.close_connection = True
                    return
                if off is not None and len(settings) == off + 3:  # (the put-back's first try, after the OFF's two)
                    self.send_error(503)
                    return
                if sent == {"trace_level": ["OFF"]}:
                    with open(os.path.join(trace_dir, "profile-digits.json"), "w") as f:
                        json.dump({"traceEvents": []}, f)
            self._answer({})

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    with _in_a_thread(server) as url:
        try:
            yield url, infers, settings
        finally:
            released.set()  # (its held requests end)
