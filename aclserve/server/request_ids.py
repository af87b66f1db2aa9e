"""How much of a client's request id the server keeps: traces and log lines cut it there
(observe.request_id), and so does the answer of a gRPC request refused before it was parsed
(grpc_wire.names). A module of its own so that the wire parser takes the bound without importing
the trace package or client_text (whose tables take ~50 ms to build)."""

MAX_REQUEST_ID = 256  # characters of a request id kept; longer ones are cut
