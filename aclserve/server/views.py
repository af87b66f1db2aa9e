"""Protocol-neutral answers of the KServe v2 API other than infer.

One implementation of metadata, readiness, config, statistics and the repository API that the
HTTP routes (routes.py) render as JSON and the gRPC service (grpc_service.py) as protobuf
messages, so both transports give the same answers and raise the same typed errors.
"""
from __future__ import annotations

from .._version import __version__
from ..errors import InvalidInput, NotFound, ServeError
from ..trace import TraceSettingsError
from .model_info import model_config, model_metadata
from .model_stats import model_stats

SERVER_NAME = "aclserve"
EMPTY_MODEL_NAME = "model name must not be empty"
# one repository is served: Triton's words for a call naming one (HTTP 400, gRPC UNIMPLEMENTED)
NAMED_REPOSITORY = "'repository_name' specification is not supported"
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository",
              "schedule_policy", "statistics", "trace"]
# Triton's extensions not offered, as its server metadata (generate: its docs) names them, and what to do
# instead: refused naming their own (HTTP 400 on their routes, gRPC UNIMPLEMENTED from their methods), not_offered
NOT_OFFERED = {"system_shared_memory": "send tensors in the request",
               "cuda_shared_memory": "send tensors in the request",
               "logging": "set log_level in the server's config",
               "generate": "send the inputs as tensors to the model's infer route"}


def version_key(version: str):
    return (0, int(version)) if version.isdigit() else (1, version)


def model_name(name: str) -> str:
    """`name`, a request's model; InvalidInput when it is empty (over gRPC a field left unset:
    every RPC naming one model refuses it alike, but ModelReady, false as Triton answers; HTTP
    has no route for it and answers 400 the same: error_responses.py)."""
    if not name:
        raise InvalidInput(EMPTY_MODEL_NAME)
    return name


def not_offered(extension: str) -> str:
    """The refusal of `extension`, one of NOT_OFFERED, over HTTP and gRPC alike."""
    return f"the {extension} extension is not supported by aclserve ({NOT_OFFERED[extension]})"


def server_metadata() -> dict:
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def metadata(state, name: str, version: str | None) -> dict:
    served = state.repo.get(name, version)
    versions = sorted((v for _, v in state.ready_versions(served.name)), key=version_key)
    return model_metadata(served, versions or [str(served.version)])


def config(state, name: str, version: str | None) -> dict:
    return model_config(state.repo.get(name, version))


def model_ready(state, name: str, version: str | None) -> bool:
    """True when the version serves and the server is not shutting down; NotFound for a model
    or version the repository does not know, InvalidInput for a version that is not a number."""
    try:
        served = state.repo.get(name, version)
    except (NotFound, InvalidInput):
        raise
    except ServeError:  # known but not serving (loading, failed, draining)
        return False
    return not state.shutting_down and served.pool.out_of_service() is None  # an instance can run it


def statistics(state, name: str | None, version: str | None) -> dict:
    """Triton's statistics extension: every ready version, a model's versions, or one version."""
    if name is None:
        pairs = state.ready_versions()
    elif version in (None, ""):
        served = state.repo.get(name)  # NotFound for an unknown model
        pairs = state.ready_versions(name) or [(name, str(served.version))]
    else:
        served = state.repo.get(name, version)
        pairs = [(name, str(served.version))]
    stats = []
    for model, ver in sorted(pairs, key=lambda p: (p[0], version_key(p[1]))):
        try:
            served = state.repo.get(model, ver)
        except Exception:
            continue
        entry = {"name": model, "version": ver}
        entry.update(model_stats(served.batcher.stats))
        # aclserve's own field: compute-stream busy fraction per instance
        entry["utilisation"] = served.pool.utilisation()
        entry.setdefault("response_stats", {})
        entry.setdefault("memory_usage", [])
        stats.append(entry)
    return {"model_stats": stats}


def trace_settings(state, model: str | None, changes: dict | None) -> dict:
    """Triton's trace extension: the settings in force (global, or the model's), after applying
    `changes` when given ({} for a model: drop its own settings). NotFound for an unknown model.
    The trace file as a client may see it: the operator's `--trace` may be an absolute path, shown
    relative to its folder; that name sent back means the operator's file (what was read, written
    back, changes nothing), not one of that name inside the trace folder."""
    if model:
        state.repo.get(model)
    if changes is not None:
        try:
            state.tracer.update(_operator_file_as_shown(state, changes), model)
        except TraceSettingsError as e:
            raise InvalidInput(str(e)) from None
    doc = state.tracer.settings(model).as_triton()
    trace_file = doc.get("trace_file")
    if trace_file:
        doc["trace_file"] = [state.redact(f) for f in trace_file] if isinstance(trace_file, list) \
            else state.redact(trace_file)
    return doc


def _operator_file_as_shown(state, changes):
    """`changes` with a trace_file equal to the operator's file as trace_settings shows it made
    that file."""
    operator = state.tracer.operator_file
    if not isinstance(changes, dict) or not operator:
        return changes
    shown = state.redact(operator)
    value = changes.get("trace_file")
    if shown != operator and (value == shown or value == [shown]):
        return {**changes, "trace_file": operator}
    return changes


async def repository_index(state, ready_only: bool) -> list[dict]:
    """Index rows of the folder as it is now (repo.index_now); names (a models folder that cannot
    be read is named by its path) and reasons with this machine's paths redacted (redact.py)."""
    rows = await state.repo.index_now(ready_only=ready_only)
    return [{"name": state.redact(e["name"]), "version": str(e.get("version", "")), "state": e.get("state", ""),
             "reason": state.redact(e.get("reason", "") or "")} for e in rows]


def check_load_parameters(params: dict) -> None:
    """Loading with an uploaded config or files is refused: the repository folder is the source. A
    parameter without a value (JSON null; over gRPC one with no choice set) is none, as null is
    elsewhere: `{"config": null}` was refused as an override."""
    if any(k == "config" or k.startswith("file:") for k, v in params.items() if v is not None):
        raise InvalidInput("loading with a config override or uploaded files is not supported; "
                           "put the model in the repository folder")
