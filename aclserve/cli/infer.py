"""`aclserve infer`: a small KServe v2 HTTP client that sends .npy inputs, or a JPEG / PNG file
as one image of a BYTES input (binary tensor extension), to a running server and prints the
outputs (a classification's labels too). Standard library and numpy only, but for --json's
printing; it shares the header name, the dtype table, the words of a refused request
(input_refusals.py), the bounds of --priority and --classification and the JSON encoder of outputs
(--json's, orjson) with the server, nothing else; what the model's metadata lets it check before
sending is infer_metadata.py's."""
from __future__ import annotations

import http.client
import json
import os
import re
import struct
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from ..config.schema import MAX_VERSION_DIGITS
from ..dtypes import kserve_to_numpy, numpy_to_kserve
from ..input_refusals import MAX_CLASSIFICATION_ENTRIES, bool_bytes_refused
from ..regular_files import open_regular
from ..server.codec import HEADER_LENGTH
from ..server.json_tensors import dumps as json_dumps
from ..server.parameters import UINT64_MAX
from .output import print_err, print_out
from .client_tls import add_client_cert_options, client_tls
from .infer_metadata import cast_to_model, described, refuse_unknown_inputs, requested_outputs
from .remote import (CLOSED_UNANSWERED, MAX_TIMEOUT_S, auth_headers, broke_off, check_url, host_unresolvable,
                     kserve_error, os_reason, redirect_refused, scheme_hint, token_hint, unreachable)
from .usage import NotKServe, UsageError, one_line


def add_commands(sub) -> None:
    q = sub.add_parser("infer", help="send one inference request to a running server",
                       description="Send .npy inputs (or a JPEG or PNG file for an image input) to a "
                                   "KServe v2 server (binary tensor extension) and print the outputs.")
    q.add_argument("model")
    q.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE", required=True,
                   help="an input tensor from a .npy file, or one image from a JPEG or PNG file for a BYTES "
                        "(image) input (repeat for several inputs); split at the '=' after the longest of "
                        "the model's input names NAME=FILE begins with (a name may hold '='), else at the first")
    q.add_argument("--url", default="http://127.0.0.1:8000", help="server URL (default %(default)s)")
    q.add_argument("--version", help="model version (default: the server's choice)")
    q.add_argument("--output", "-o", action="append", default=[], metavar="NAME",
                   help="an output to return (repeat; default all)")
    q.add_argument("--classification", type=int, metavar="N",
                   help="the top N classes of each output (or of those named with --output), as "
                        "score:index[:label] strings; without --output, an FP16 or BOOL output, which "
                        "has none, is printed as it is (refused when no output has classes)")
    q.add_argument("--priority", type=int, help="request priority level (1 = highest)")
    q.add_argument("--json", action="store_true", help="print the outputs as one JSON object")
    q.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for each answer (metadata, then the inference; default %(default)s)")
    add_client_cert_options(q)
    q.set_defaults(func=run_infer)


# an output of up to this many values is printed whole (numpy's own default threshold: 1,000
# classes of one image); a larger one, its first and last values, saying so
PRINTED_WHOLE = 1000
_NPY_MAGIC = b"\x93NUMPY"
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG, PNG: sent as they are, one image


def split_input(pair: str, names=()) -> tuple[str, str]:
    """--input's NAME=FILE: at the '=' after the longest of the model's input `names` it begins
    with (an input "a=b" takes "a=b=/p/e.npy"), else at the first '='."""
    for name in sorted((n for n in names if isinstance(n, str) and n), key=len, reverse=True):
        if pair.startswith(f"{name}=") and len(pair) > len(name) + 1:
            return name, pair[len(name) + 1:]
    name, sep, path = pair.partition("=")
    if not sep or not name or not path:
        raise UsageError(f"--input expects NAME=FILE (.npy, JPEG or PNG), got {pair!r}")
    return name, path


def _load_inputs(pairs: list[str], names=()) -> dict[str, np.ndarray]:
    """The files of --input's `pairs`, split at the names of the model's inputs `names`."""
    inputs = {}
    for pair in pairs:
        name, path = split_input(pair, names)
        if name in inputs:
            raise UsageError(f"--input names {name!r} twice")
        try:
            with open_regular(path) as f:  # (a FIFO held the command until written to)
                start = f.read(8)
                f.seek(0)
                if start.startswith(_IMAGE_MAGIC):
                    inputs[name] = np.array([f.read()], dtype=object)  # one image, [1]
                    continue
                if not start.startswith(_NPY_MAGIC):  # np.load's advice on pickles, or an .npz's archive
                    raise UsageError(f"cannot read {path}: not a .npy file (numpy.save writes one), a JPEG or a PNG")
                arr = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        except MemoryError:  # a header claiming a huge shape: np.load allocates it before reading
            raise UsageError(f"cannot read {path}: its header's shape needs more memory than there is") from None
        # (np.ascontiguousarray made a 0-d input [1])
        inputs[name] = arr if arr.flags.c_contiguous else np.array(arr, order="C")
    return inputs


def build_request(inputs: dict[str, np.ndarray], outputs: list[str], priority: int | None = None,
                  classes: dict[str, int] | None = None) -> tuple[bytes, int]:
    """A binary-extension request body and its JSON header length. `classes`: the top N classes
    to ask of each output it names (of `outputs`: the caller lists them)."""
    items, blobs = [], []
    for name, arr in inputs.items():
        if arr.dtype == object:  # images: BYTES elements, each a 4-byte little-endian length and its bytes
            datatype, blob = "BYTES", b"".join(struct.pack("<I", len(e)) + e for e in arr.ravel())
        else:
            try:
                datatype, blob = numpy_to_kserve(arr.dtype), arr.tobytes()
            except ValueError:
                raise UsageError(f"input {name}: dtype {arr.dtype} is not supported") from None
        items.append({"name": name, "datatype": datatype, "shape": list(arr.shape),
                      "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    doc: dict = {"inputs": items}
    if outputs:
        classes = classes or {}
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": True, **(
            {"classification": classes[n]} if n in classes else {})}} for n in outputs]
    else:
        doc["parameters"] = {"binary_data_output": True}
    if priority:
        doc.setdefault("parameters", {})["priority"] = priority
    head = json.dumps(doc).encode()
    return b"".join([head, *blobs]), len(head)


def parse_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """The outputs of an infer answer; NotKServe when it is not one."""
    try:
        return _outputs(body, header_length)
    except (ValueError, RecursionError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise NotKServe(f"its answer is not a KServe v2 inference response ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None


def _outputs(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    if header_length is not None and not 0 < header_length <= len(body):  # (its JSON was cut short: taken)
        raise ValueError(f"Inference-Header-Content-Length {header_length} is not within its "
                         f"{len(body)}-byte body")
    head = json.loads(body if header_length is None else body[:header_length])
    offset = header_length or 0
    result = {}
    if not head["outputs"]:  # (every model has an output: nothing printed and exit 0 said nothing)
        raise ValueError("it holds no outputs")
    for out in head["outputs"]:  # (a server answering {} was taken for one answering no outputs)
        size = (out.get("parameters") or {}).get("binary_data_size")
        if out["datatype"] == "BYTES":  # (a classification's score:index:label strings)
            arr = _strings(body[offset:offset + size]) if size is not None else np.array(out["data"], object)
            offset += size or 0
        elif size is not None:
            dtype = kserve_to_numpy(out["datatype"])
            arr = np.frombuffer(body, dtype, size // dtype.itemsize, offset)
            offset += size
        else:
            arr = np.asarray(out["data"], dtype=kserve_to_numpy(out["datatype"]))
        result[out["name"]] = arr.reshape(out["shape"])
    return result


def _strings(blob: bytes) -> np.ndarray:
    """The elements of a binary BYTES tensor (4-byte little-endian length, then the bytes), as str."""
    items, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("a BYTES output ends inside an element's length")
        (length,) = struct.unpack_from("<I", blob, at)
        items.append(blob[at + 4:at + 4 + length].decode(errors="replace"))
        at += 4 + length
    return np.array(items, dtype=object)


class NoAnswer(OSError):
    """The server took the connection and gave no answer within the timeout."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: urllib's would send the API token to wherever it points (a
    security tester's server on another host got it). The 3xx comes back as an HTTPError."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _opener(tls) -> urllib.request.OpenerDirector:
    """urllib's opener, redirects not followed, showing the client certificate of `tls` (an SSLContext) if any."""
    return urllib.request.build_opener(_NoRedirects, *([urllib.request.HTTPSHandler(context=tls)] if tls else []))


def _fetch(opener, request, timeout: float):
    """(body, headers) of an answer; NoAnswer for a timeout, whether it came while connecting
    (urllib's URLError wraps it) or while reading."""
    try:
        with opener.open(request, timeout=timeout) as resp:
            return resp.read(), resp.headers
    except TimeoutError:
        raise NoAnswer from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise NoAnswer from None
        raise


def _metadata(opener, url: str, timeout: float, headers: dict):
    """The model's metadata. Whatever fails its request ends the command, as the inference's would:
    the server answers both for the same model, token and version, so it would refuse that too (a
    second 401 counted, t56), and the input files were sent unchecked (a picture for a numeric
    input, floats for an integer one: the server's 400, or a model that got ready in between ran
    them). NotKServe for an answer that is not JSON."""
    body, _ = _fetch(opener, urllib.request.Request(url, headers=headers), timeout)
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # (RecursionError: JSON nested past the stack)
        raise NotKServe(f"its model metadata is not JSON ({type(e).__name__}: {str(e)[:120]})") from None


def run_infer(args) -> int:
    check_url(args.url)
    # (UTF-8 bytes, as aiohttp reads a header: http.client would encode a str as Latin-1)
    headers = {name: value.encode() for name, value in auth_headers().items()}
    if not 0 < args.timeout <= MAX_TIMEOUT_S:  # (NaN fails it; 1e10 was the socket's OverflowError, a traceback)
        raise UsageError(f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:,} (30 days)")
    for pair in args.input:  # (NAME=FILE said wrong before the server is asked anything)
        split_input(pair)
    # (os.fsencode: a name of bytes that are not UTF-8 goes as they are, for the server to refuse)
    path = f"/v2/models/{urllib.parse.quote(os.fsencode(args.model), safe='')}"
    if args.version:  # (a server's 400 for it was exit 1, a server's error: a tester, t86)
        if not (args.version.isascii() and args.version.isdigit() and 0 < int(args.version)
                and len(args.version) <= MAX_VERSION_DIGITS):
            raise UsageError(f"--version must be a positive integer of at most {MAX_VERSION_DIGITS} digits, "
                             f"got {args.version!r}")
        path += f"/versions/{args.version}"
    if args.classification is not None and not 0 < args.classification <= MAX_CLASSIFICATION_ENTRIES:
        # (99999999999999999999 went on, read past 64 bits as a float: the server's "must be a non-negative
        # integer"; past the bound, no answer holds more classes: a tester, t92)
        raise UsageError(f"--classification must be a number of classes from 1 to {MAX_CLASSIFICATION_ENTRIES:,}, "
                         f"the most class strings an answer holds, got {args.classification}")
    if args.priority is not None and not 0 <= args.priority <= UINT64_MAX:  # (the server's 400 was exit 1)
        raise UsageError(f"--priority must be a level from 1 (the highest), or 0 for the model's default, at most "
                         f"{UINT64_MAX} (a uint64), got {args.priority}")
    opener = _opener(client_tls(args))
    cannot = host_unresolvable(args.url)
    if cannot:
        return _failed(unreachable(args.url, cannot))
    try:
        outputs = _ask(args, opener, path, headers)
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:  # (a KServe v2 server answers in place)
            return _failed(redirect_refused(args.url, e.code, e.headers.get("Location")))
        raw = e.read()
        message = kserve_error(raw)
        said = f"HTTP {e.code}: {one_line(raw.decode(errors='replace') if message is None else message) or e.reason}"
        if message is None:  # (a web server's HTML, say: "HTTP 501: <!DOCTYPE HTML>" alone told nothing)
            return _failed(f"{args.url} did not answer as a KServe v2 HTTP server: {said}{token_hint(e.code)}")
        return _failed(f"{said}{token_hint(e.code)}")
    except NoAnswer:
        return _failed(f"no answer from {args.url} within {args.timeout:g} s (--timeout)")
    except http.client.RemoteDisconnected:  # (before HTTPException: a TLS port, a server refusing --cert)
        return _failed(broke_off(args.url, CLOSED_UNANSWERED, args.cert))
    except http.client.InvalidURL as e:  # (before HTTPException: a blank in the host, refused unsent)
        return _failed(unreachable(args.url, e))
    except (http.client.HTTPException, NotKServe) as e:  # (a gRPC port, or another kind of server)
        said = one_line(e) or type(e).__name__
        return _failed(f"{args.url} did not answer as a KServe v2 HTTP server: {said}"
                       f"{scheme_hint(args.url, said, args.cert)}")
    except urllib.error.URLError as e:
        return _failed(unreachable(args.url, e.reason, args.cert))
    except OSError as e:  # (the connection reset or closed mid-answer)
        return _failed(broke_off(args.url, os_reason(e), args.cert))
    if args.json:
        print_out(_json_text(outputs))
    else:
        with np.printoptions(threshold=PRINTED_WHOLE, edgeitems=4):
            for name, arr in outputs.items():
                elided = (f" ({arr.size:,} values: the middle ones elided here; --json prints them all)"
                          if arr.size > PRINTED_WHOLE else "")
                print_out(f"{name} {_dtype_name(arr)} {list(arr.shape)}{elided}")
                print_out(arr)
    return 0


def _dtype_name(arr: np.ndarray) -> str:
    return "BYTES" if arr.dtype == object else str(arr.dtype)


_NOT_ASCII = re.compile(r"[^\x00-\x7f]")  # (found only in JSON's strings, where an escape may stand for it)


def _json_text(outputs: dict[str, np.ndarray]) -> str:
    """--json's object, its numbers written by the server's JSON encoder, as its answers have them: FP32 and
    FP16 values in their shortest form (tolist() wrote float64 noise, 0.008342617191374302 for 0.008342617),
    NaN and infinities, no JSON numbers, as null."""
    # (C order: orjson writes any other array through tolist(); np.require keeps a 0-d one 0-d)
    text = json_dumps({name: {"shape": list(arr.shape), "dtype": _dtype_name(arr), "data": np.require(arr, None, "C")}
                       for name, arr in outputs.items()}).decode()
    # ASCII, as json.dumps wrote it (a stdout not in UTF-8 cannot take every label): \uXXXX escapes
    return _NOT_ASCII.sub(lambda found: json.dumps(found.group())[1:-1], text)


def _ask(args, opener, path: str, headers: dict) -> dict[str, np.ndarray]:
    """Metadata (the input names --input's are split at, the casts, the outputs asked for and those
    to classify), then the input files, then the inference; the outputs."""
    metadata = _metadata(opener, args.url.rstrip("/") + path, args.timeout, headers)
    names = [t.get("name") for t in described(metadata, "inputs")]
    inputs = _load_inputs(args.input, names)
    refuse_unknown_inputs(inputs, names)
    notes = cast_to_model(inputs, metadata)
    for name, arr in inputs.items():  # (sent, the server's 400 was exit 1, a server's error: t93)
        refusal = bool_bytes_refused(name, arr)
        if refusal:
            raise UsageError(refusal)
    outputs, classes, left_as_they_are = requested_outputs(args.model, args.output, args.classification, metadata)
    for note in notes + left_as_they_are:
        print_err(f"aclserve infer: {note}")
    body, header_length = build_request(inputs, outputs, args.priority, classes)
    req = urllib.request.Request(args.url.rstrip("/") + path + "/infer", data=body, method="POST",
                                 headers={HEADER_LENGTH: str(header_length),
                                          "Content-Type": "application/octet-stream", **headers})
    data, headers = _fetch(opener, req, args.timeout)
    length = headers.get(HEADER_LENGTH)
    try:
        header_length = None if length is None else int(length)
    except ValueError:
        raise NotKServe(f"its {HEADER_LENGTH} header is not a number") from None
    return parse_response(data, header_length)


def _failed(message: str) -> int:
    print_err(f"aclserve infer: error: {message}")
    return 1
