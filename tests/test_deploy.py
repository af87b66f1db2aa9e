"""deploy/: the container images and the Kubernetes / KServe manifests.

Each manifest is built field by field into the model class of its kind from the published API
schemas (tests/deploy_schema.py, in its own process): the `kubernetes` client's models for
Kubernetes kinds, the KServe SDK's models (generated from KServe's CRDs) for ServingRuntime and
InferenceService. A field the schema lacks or a value of the wrong type fails, and the models'
constructors check required fields.
Then the manifests are checked against the server itself: their arguments parse with the real
CLI, their ports are the ones those arguments open, their probes and scrape paths are real
routes, and the termination grace covers the shutdown drain. No cluster is involved.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from aclserve.cli import build_parser
from aclserve.config import load_server_config
from aclserve.cli.serve import serve_overrides
from aclserve.server.routes import add_routes

from tests import REPO
from tests.serving import ServerThread, free_port, server_config as serving_config

DEPLOY = REPO / "deploy"
def manifests() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(DEPLOY.glob("*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((str(path.relative_to(REPO)), doc))
    return docs


def find(kind: str, name: str | None = None) -> dict:
    found = [d for _, d in manifests() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def get_routes() -> set[str]:
    app = web.Application()
    add_routes(app)
    return {r.resource.canonical for r in app.router.routes() if r.method == "GET"}


def server_config(args: list[str]):
    """What `aclserve serve ARGS` would run with (the image's entrypoint runs `aclserve serve`, under tini)."""
    return load_server_config(None, serve_overrides(build_parser().parse_args(["serve", *args])))


def port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def schema_errors(paths: list[Path]) -> dict[tuple[str, int], str | None]:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "deploy_schema.py"), *map(str, paths)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return {(Path(r["source"]).name, r["index"]): r["error"] for r in json.loads(proc.stdout)}


def test_every_manifest_fits_the_published_schema_of_its_kind():
    paths = sorted(DEPLOY.glob("*/*.yaml"))
    errors = schema_errors(paths)
    assert {name for name, _ in errors} == {p.name for p in paths}
    assert {key: e for key, e in errors.items() if e} == {}


def test_the_schema_check_refuses_unknown_fields_wrong_types_and_missing_fields(tmp_path):
    deployment = find("Deployment")
    changes = {
        "misspelt.yaml": (lambda c: c.update(readinesProbe=c.pop("readinessProbe")), "has no such field"),
        "port-string.yaml": (lambda c: c["ports"][0].update(containerPort="8000"), "expected int"),
        "cpu-number.yaml": (lambda c: c["resources"]["requests"].update(cpu=2), "expected str"),
        "no-name.yaml": (lambda c: c.pop("name"), "`name`, must not be `None`"),
    }
    for file, (change, _) in changes.items():
        broken = json.loads(json.dumps(deployment))
        change(broken["spec"]["template"]["spec"]["containers"][0])
        (tmp_path / file).write_text(yaml.safe_dump(broken))
    runtime = json.loads(json.dumps(find("ServingRuntime")))
    runtime["spec"]["protocolVersion"] = ["v2"]  # the field is protocolVersions
    (tmp_path / "runtime.yaml").write_text(yaml.safe_dump(runtime))
    errors = schema_errors(sorted(tmp_path.glob("*.yaml")))
    for file, (_, message) in changes.items():
        assert message in (errors[(file, 0)] or ""), (file, errors[(file, 0)])
    assert "protocolVersion: V1alpha1ServingRuntimeSpec has no such field" in (errors[("runtime.yaml", 0)] or "")


def check_probes(container: dict, http_port: int, routes: set[str]) -> None:
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe not in container:
            continue
        action = container[probe]["httpGet"]
        assert action["path"] in routes, (probe, action["path"])
        assert port_number(container, action["port"]) == http_port, probe
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_deployment_service_and_hpa_match_the_server():
    routes = get_routes()
    deployment = find("Deployment", "aclserve")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert "command" not in container  # the image's entrypoint (tini, `aclserve serve`) takes the args
    config = server_config(container["args"])
    assert config.host == "0.0.0.0" and config.models_dir == "/models"
    # replicas share the folder: one stray file in it must not turn every one unready (README)
    assert config.readiness == "lenient"
    assert port_number(container, "http") == config.port and port_number(container, "grpc") == config.grpc_port
    check_probes(container, config.port, routes)
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"  # the port open, not the models in
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and int(notes["prometheus.io/port"]) == config.port
    assert notes["prometheus.io/path"] in routes
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["spec"]["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + config.shutdown_timeout_s + 5
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claim = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts["/models"])
    assert claim["persistentVolumeClaim"]["claimName"] == find("PersistentVolumeClaim")["metadata"]["name"]
    assert "ReadWriteMany" in find("PersistentVolumeClaim")["spec"]["accessModes"]

    service = find("Service", "aclserve")
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert {port_number(container, p["targetPort"]) for p in service["spec"]["ports"]} == {config.port, config.grpc_port}
    hpa = find("HorizontalPodAutoscaler", "aclserve")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "aclserve"}
    assert any(m.get("pods", {}).get("metric", {}).get("name") == "aclserve_queue_depth" for m in hpa["spec"]["metrics"])


def test_kserve_runtime_and_inference_services_match_the_server():
    routes = get_routes()
    runtime = find("ServingRuntime", "aclserve-ascend")
    spec = runtime["spec"]
    container = spec["containers"][0]
    assert container["name"] == "kserve-container" and "command" not in container
    config = server_config(container["args"])
    assert config.models_dir == "/mnt/models" and config.host == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [config.port]
    # named: merged with an InferenceService's own port (h2c), a Service of two unnamed is refused
    assert all(p.get("name") for p in container["ports"])
    check_probes(container, config.port, routes)
    # Knative before 1.15 (serving#15309) refuses a startupProbe in a Serverless InferenceService
    assert "startupProbe" not in container
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == config.port
    assert spec["annotations"]["prometheus.kserve.io/path"] in routes
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {"name": "ACLSERVE_DEVICE", "value": "npu"} in container["env"]
    # the image's HEALTHCHECK (docker, podman) asks the port the server listens on, not the image's 8000
    assert {"name": HEALTH_PORT, "value": str(config.port)} in container["env"]
    for section in ("requests", "limits"):
        assert container["resources"][section].get("huawei.com/Ascend310P") == "1"
    cache = next(m for m in container["volumeMounts"] if m["mountPath"] == config.compile_cache_dir)
    assert any(v["name"] == cache["name"] and "emptyDir" in v for v in spec["volumes"])
    formats = {f["name"] for f in spec["supportedModelFormats"]}

    for name, protocol in (("digits", "v2"), ("digits-grpc", "grpc-v2")):
        predictor = find("InferenceService", name)["spec"]["predictor"]
        model = predictor["model"]
        assert model["runtime"] == "aclserve-ascend" and model["modelFormat"]["name"] in formats
        assert model["protocolVersion"] == protocol
        if protocol == "v2":  # Knative: it refuses terminationGracePeriodSeconds (its revision timeout, 300 s)
            assert "terminationGracePeriodSeconds" not in predictor
            assert "lifecycle" not in model and "lifecycle" not in container  # (and a preStop)
            assert find("InferenceService", name)["metadata"]["annotations"][
                "serving.kserve.io/deploymentMode"] == "Serverless"
        else:
            # RawDeployment: the gRPC port closes on SIGTERM while endpoints may still list the pod
            # (it had no preStop; README said it had); the model's Container is merged into the runtime's
            pre_stop = model["lifecycle"]["preStop"]["exec"]["command"]
            assert pre_stop[0] == "sleep"
            assert predictor["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + config.shutdown_timeout_s + 5
        if protocol == "grpc-v2":
            assert [(p["name"], p["containerPort"]) for p in model["ports"]] == [("h2c", config.grpc_port)]
        check_scraping(find("InferenceService", name), config.port, routes)


def check_scraping(service: dict, http_port: int, routes: set[str]) -> None:
    """The pod's prometheus.io annotations reach aclserve's /metrics. KServe's pod webhook, with
    serving.kserve.io/enable-prometheus-scraping, points prometheus.io/port at queue-proxy: its
    aggregate port (9088: its metrics and the runtime's prometheus.kserve.io/port's) with
    enable-metric-aggregation, else its own metrics (9091). Neither was set: the runtime's
    annotations took no effect. A RawDeployment has no queue-proxy: its pod names the port itself."""
    notes, pod = service["metadata"]["annotations"], service["spec"]["predictor"].get("annotations", {})
    assert pod.get("prometheus.io/scrape") == "true"  # (KServe sets a port and a path, not this)
    if notes["serving.kserve.io/deploymentMode"] == "Serverless":
        assert notes.get("serving.kserve.io/enable-prometheus-scraping") == "true"
        assert notes.get("serving.kserve.io/enable-metric-aggregation") == "true"
    else:
        assert pod.get("serving.kserve.io/enable-prometheus-scraping") == "false"  # (a cluster default of true)
        assert int(pod["prometheus.io/port"]) == http_port and pod["prometheus.io/path"] in routes


def dockerfile(path: Path) -> dict[str, list[str]]:
    """Instruction -> its arguments (continuation lines joined; repeated instructions appended)."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(line for line in path.read_text().splitlines()
                                             if not line.lstrip().startswith("#")))
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.setdefault(word.upper(), []).append(rest.strip())
    return found


HEALTH_PORT = "ACLSERVE_HEALTH_PORT"  # the port the images' HEALTHCHECK asks


def image_env(instructions: dict[str, list[str]]) -> dict[str, str]:
    """The image's ENV, NAME=VALUE pairs."""
    return dict(pair.split("=", 1) for env in instructions["ENV"] for pair in env.split())


def health_check(instructions: dict[str, list[str]]) -> list[str]:
    """The HEALTHCHECK's command (exec form)."""
    return json.loads(instructions["HEALTHCHECK"][-1].partition(" CMD ")[2])


@pytest.mark.parametrize("image", ["Dockerfile", "Dockerfile.ascend"])
def test_the_images_health_check_asks_the_port_its_variable_names(image, tmp_path):
    """The check was fixed to 127.0.0.1:8000, while the Ascend image, run as the ServingRuntime
    runs it, listens on 8080: under docker or podman it always failed (a tester, t59). It asks
    ACLSERVE_HEALTH_PORT's port now: run here against a real server on another port."""
    command = health_check(dockerfile(DEPLOY / image))
    assert command[0] in ("python", "python3")
    models = tmp_path / "models"
    models.mkdir()
    (models / "digits.om").write_bytes((REPO / "models" / "digits.om").read_bytes())
    with ServerThread(serving_config(models)) as srv:
        port = srv.url.rpartition(":")[2]
        env = {"PATH": "/usr/bin:/bin", HEALTH_PORT: port}
        asked = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        env[HEALTH_PORT] = str(free_port())  # (nothing there: the check fails)
        assert subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=60).returncode != 0


def test_images_run_the_cli_on_the_server_ports_as_a_non_root_user():
    routes = get_routes()
    default = load_server_config()
    setup = (REPO / "setup.py").read_text()
    assert '"aclserve=aclserve.cli:main"' in setup  # the console script the entrypoint runs
    cpu = dockerfile(DEPLOY / "Dockerfile")
    # an init as PID 1: Python there ignores SIGTERM until the server sets its handler
    assert json.loads(cpu["ENTRYPOINT"][-1]) == ["tini", "--", "aclserve", "serve"]
    assert any("apt-get install" in run and " tini " in f"{run} " for run in cpu["RUN"])
    config = server_config(json.loads(cpu["CMD"][-1]))
    assert config.host == "0.0.0.0" and config.models_dir == "/models"
    assert {int(p) for p in cpu["EXPOSE"][-1].split()} == {default.port, default.grpc_port}
    assert cpu["USER"][-1].split(":")[0] not in ("0", "root")
    assert "ACLSERVE_DEVICE=cpu" in cpu["ENV"][-1]
    probe = re.search(r"http://127\.0\.0\.1:\{port\}(/[^'\"]+)", cpu["HEALTHCHECK"][-1])
    assert probe.group(1) in routes and image_env(cpu)[HEALTH_PORT] == str(default.port)

    ascend = dockerfile(DEPLOY / "Dockerfile.ascend")
    assert (DEPLOY / "Dockerfile.ascend").read_text().startswith("# UNTESTED")
    # the entrypoint script (tests/test_deploy_ascend_entrypoint.py runs it) runs `python -m aclserve serve`
    assert json.loads(ascend["ENTRYPOINT"][-1]) == ["/usr/bin/tini", "--", "/usr/local/bin/aclserve-entrypoint"]
    install = next(run for run in ascend["RUN"] if "pip install" in run)
    assert "deploy/ascend-entrypoint.sh /usr/local/bin/aclserve-entrypoint" in install
    assert "python3 -m venv /opt/aclserve" in install and "ACLSERVE_VENV=/opt/aclserve" in ascend["ENV"][-1]
    assert "--constraint deploy/ascend-constraints.txt" in install
    assert "--from=tini /usr/bin/tini-static /usr/bin/tini" in ascend["COPY"]
    assert "deploy/ascend-constraints.txt deploy/ascend-entrypoint.sh ./deploy/" in ascend["COPY"]
    assert server_config(json.loads(ascend["CMD"][-1])).models_dir == "/models"
    assert "ACLSERVE_DEVICE=npu" in ascend["ENV"][-1] and ascend["USER"][-1] not in ("0", "root")
    assert image_env(ascend)[HEALTH_PORT] == str(default.port)
    ignore = (REPO / ".dockerignore").read_text().split()
    assert {"!setup.py", "!README.md", "!aclserve/", "!deploy/ascend-entrypoint.sh",
            "!deploy/ascend-constraints.txt"} <= set(ignore)


def mount_covering(path: str, container: dict, volumes: list[dict]) -> dict | None:
    """The volume mounted at `path` or at a folder above it, or None."""
    above = [m for m in container.get("volumeMounts", [])
             if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not above:
        return None
    deepest = max(above, key=lambda m: len(m["mountPath"]))
    return next(v for v in volumes if v["name"] == deepest["name"])


def test_trace_files_named_through_the_api_land_in_a_writable_folder():
    # trace_dir is relative to the working directory: / (no WORKDIR) is not writable by the
    # image's user, and the Deployment's root filesystem is read-only
    for name in ("Dockerfile", "Dockerfile.ascend"):
        image = dockerfile(DEPLOY / name)
        workdir = image["WORKDIR"][-1]
        assert workdir != "/" and any("chown aclserve:aclserve" in run and workdir in run.split()
                                      for run in image["RUN"]), (name, workdir)
    workdir = dockerfile(DEPLOY / "Dockerfile")["WORKDIR"][-1]
    pod = find("Deployment", "aclserve")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    trace_dir = str(Path(workdir) / server_config(container["args"]).trace_dir)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volume = mount_covering(trace_dir, container, pod["volumes"])
    assert volume is not None and "emptyDir" in volume, trace_dir


def test_the_cpu_image_bakes_the_example_model_with_its_config_and_labels():
    copies = [c.split() for c in dockerfile(DEPLOY / "Dockerfile")["COPY"] if "/models/" in c]
    assert len(copies) == 1
    sources = [s for s in copies[0][:-1] if not s.startswith("--")]
    assert copies[0][-1] == "/models/"
    config = yaml.safe_load((REPO / "models" / "digits.yaml").read_text())
    labels = {f"models/{o['labels']}" for o in config["outputs"].values() if "labels" in o}
    assert {"models/digits.om", "models/digits.yaml"} | labels <= set(sources)
    # the build context holds only what .dockerignore lets through
    ignore = (REPO / ".dockerignore").read_text().split()
    assert all(f"!{s}" in ignore and (REPO / s).is_file() for s in sources), sources


def test_the_deployment_and_the_inference_services_read_separate_folders_of_the_claim(tmp_path):
    """A folder of digits.om inside the Deployment's models root is not a version folder: with
    the InferenceServices' folder there, every replica stayed unready."""
    from aclserve.config import ModelConfig
    from aclserve.repository.layout import scan

    pod = find("Deployment", "aclserve")["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/models")
    claim = next(v for v in pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]["claimName"]
    deployment_root = Path(mount.get("subPath", "."))
    kserve_roots = []
    for name in ("digits", "digits-grpc"):
        uri = find("InferenceService", name)["spec"]["predictor"]["model"]["storageUri"]
        assert uri.startswith(f"pvc://{claim}/"), uri
        kserve_roots.append(Path(uri.removeprefix(f"pvc://{claim}/")))
    # the claim as the manifests lay it out: each model folder holding digits.om (the
    # InferenceServices' /mnt/models), the Deployment's root the same model beside others
    for root in {deployment_root, *kserve_roots}:
        (tmp_path / root).mkdir(parents=True, exist_ok=True)
        (tmp_path / root / "digits.om").write_bytes(b"")
    for root in {deployment_root, *kserve_roots}:
        found = scan(tmp_path / root, ModelConfig())
        assert found.problems == {} and set(found.models) == {"digits"}, (root, found.problems)


# What the CPU runtime's process holds per byte of weights it counts (measured by a tester,
# 2026-12-06, an MLP of 1.2 GB of weights; ONNX Runtime keeps its own copy of the weights and
# pre-packs them, and intermediates are not counted): 2.0x once loaded, 2.1x at the load's peak;
# an .onnx's compile child 5.3x (6.3x with the weights inside the .onnx) in the same cgroup; a
# served .onnx replaced holds the old version and the new one's compile child: 7.3x measured,
# 8.3x by the same figures with the weights inside the .onnx.
RSS_PER_COUNTED_BYTE = {"loaded": 2.0, "loading": 2.1, "compiling": 6.3, "replacing": 8.3}


def test_a_model_the_cpu_runtime_accepts_fits_the_container_memory_limit_by_the_measured_ratios():
    """A 1 GiB model was accepted under 2G of the Deployment's 4Gi and its process then held
    3.05 GiB, 4.90 GiB while loading and 6.1 GiB while compiling its .onnx: the budget under the
    limit was no bound. The budget times the worst ratio must fit (memory_reserve_fraction, kept
    free of loads, leaves room for the server itself): a replaced .onnx's, the old version and the
    new compile child at once (/ 6 left 7.3x of a tester's replace over the limit)."""
    from kubernetes.utils import parse_quantity

    from aclserve.acl.cpu import settings

    assert load_server_config().memory_reserve_fraction > 0
    for container in (find("Deployment", "aclserve")["spec"]["template"]["spec"]["containers"][0],
                      find("ServingRuntime", "aclserve-ascend")["spec"]["containers"][0]):
        env = {e["name"]: e["value"] for e in container["env"]}
        # the runtime's container is set for the NPU; its CPU instructions change the device only
        budget = settings.parse_size(env.get("ACLSERVE_CPU_DEVICE_MEMORY", "8G")) \
            * int(env.get("ACLSERVE_CPU_DEVICES", settings.DEFAULT_DEVICES))
        limit = parse_quantity(container["resources"]["limits"]["memory"])
        assert budget * max(RSS_PER_COUNTED_BYTE.values()) <= limit, (container["name"], budget, limit)


def test_atc_caches_operators_in_a_writable_volume_wherever_the_ascend_image_may_run():
    """ATC caches operators in $HOME/atc_data unless ASCEND_CACHE_PATH is set; the Deployment's
    root file system is read-only and $HOME no volume there."""
    ascend = dockerfile(DEPLOY / "Dockerfile.ascend")
    image_env = dict(re.findall(r"(\w+)=(\S+)", ascend["ENV"][-1]))
    assert image_env["ASCEND_CACHE_PATH"].startswith(ascend["WORKDIR"][-1] + "/")
    deployment = find("Deployment", "aclserve")["spec"]["template"]["spec"]
    runtime = find("ServingRuntime", "aclserve-ascend")["spec"]
    for container, volumes in ((deployment["containers"][0], deployment["volumes"]),
                               (runtime["containers"][0], runtime["volumes"])):
        env = {e["name"]: e["value"] for e in container["env"]}
        for name in ("ASCEND_CACHE_PATH", "HOME"):
            path = env.get(name, image_env[name])
            if name == "HOME" and not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                continue  # the image's home is writable where the root is
            volume = mount_covering(path, container, volumes)
            assert volume is not None and "emptyDir" in volume, (container["name"], name, path)
