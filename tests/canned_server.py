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
def web_server(folder):
    """`python -m http.server` on 127.0.0.1, serving `folder`, in a thread: a plain web server
    (404 HTML pages, 501 to a POST). Yields its URL."""
    import functools
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def redirect_to(location: str, status: int = 302) -> bytes:
    """A canned answer redirecting to `location`."""
    return (b"HTTP/1.1 %d Redirect\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            % (status, location.encode()))
