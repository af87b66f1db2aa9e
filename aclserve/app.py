"""The composition root: one ServerConfig in; the ACL runtime, the model repository, the HTTP
app and the gRPC server built and wired together here, and nowhere else.

`aclserve serve` (cli/serve.py) and the tests' server thread run `serve`. The packages below only
receive what is built here: server/ takes the repository and runtime it is handed, and its
app's lifecycle starts and closes them in order (server/app.py).
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from .config import ConfigError
from .repository import ModelRepository
from .runtime import AclRuntime
from .server.app import create_app
from .server.app import serve as serve_app
from .server.app_keys import STATE


def build_runtime(config) -> AclRuntime:
    """The runtime `config` asks for; not started (the app's lifecycle starts it)."""
    return AclRuntime(device=config.device, cpu_threads=config.cpu_threads,
                      memory_reserve_fraction=config.memory_reserve_fraction,
                      device_limits=config.device_limits)


def build_repository(config, runtime: AclRuntime) -> ModelRepository:
    """The repository of `config.models_dir` on `runtime`; not started."""
    return ModelRepository(config, runtime)


def build_grpc_server(config, app: web.Application):
    """The gRPC endpoint over the app's state (not listening yet), or None when `grpc_port` is 0."""
    if not config.grpc_port:
        return None
    from .server.grpc_server import GrpcServer  # grpc is imported only when the endpoint is on
    return GrpcServer(app[STATE], config.grpc_max_message_bytes)


def check_default_devices(config, runtime: AclRuntime) -> None:
    """ConfigError for a device of model_defaults.devices the host has not: every model placed
    there by default would fail its load once the server listened (a tester's `devices: [1]` on a
    host of one device). A model's own `devices` stay its load's to refuse: the others serve. So
    for images.dvpp_device with images.decoder dvpp: its pictures went to the CPU with a WARNING at
    the first one, the setting silently of no use."""
    missing = runtime.missing_devices(config.model_defaults.devices)
    if missing:
        named = (f"device {missing[0]} does not" if len(missing) == 1
                 else f"devices {', '.join(map(str, missing))} do not")
        raise ConfigError("model_defaults.devices", f"{named} exist (the host has {runtime.devices_said()})")
    images = config.images
    if images.decoder == "dvpp" and runtime.missing_devices([images.dvpp_device]):
        raise ConfigError("images.dvpp_device", f"device {images.dvpp_device} does not exist (the host has "
                          f"{runtime.devices_said()})")


async def serve(config, started: asyncio.Future | None = None, stop: asyncio.Event | None = None) -> int:
    """Build everything `config` describes and serve it until SIGTERM/SIGINT (or `stop` is set, or
    a device fails as a whole), then shut down in order. `started` gets the bound HTTP (host,
    port) once listening. Returns the exit status (server/app.py: 0, or EXIT_DEVICE_FAILED)."""
    runtime = build_runtime(config)
    check_default_devices(config, runtime)
    app = create_app(config, build_repository(config, runtime), runtime)
    return await serve_app(app, build_grpc_server(config, app), started, stop)


def work_left_running() -> int:
    """What a shutdown abandoned that still runs in this process's daemon threads: load-thread
    calls (a load, a warm-up), instances held, being closed or loaded on a device, and the
    device closes left past the shutdown's end (server/device_closes.py). Its threads may be
    inside the runtime's C code (copying into device memory, ONNX Runtime's own threads) when
    the interpreter's teardown frees what they use: `aclserve serve` then ends without that
    teardown (cli/serve.py)."""
    from .repository.load_threads import running_calls
    from .runtime import teardown
    from .server import device_closes
    return running_calls() + teardown.unreleased() + device_closes.left_running()
