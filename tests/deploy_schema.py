"""Build Kubernetes / KServe manifests into the model classes of the published API schemas.

Run as a script in its own process (tests/test_deploy.py does): the KServe SDK imports its own
generated `inference.*` protobuf messages, which cannot be loaded into a process that already
holds tritonclient's (the server's) copy of the same names.

    python tests/deploy_schema.py FILE.yaml ...   ->  JSON: [{"source", "index", "kind", "error"}]
"""
from __future__ import annotations

import json
import sys

import kserve
import yaml
from kubernetes import client as k8s

KINDS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
}
PRIMITIVES = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float)}


class SchemaError(ValueError):
    pass


def model_class(name: str):
    cls = getattr(kserve, name, None) or getattr(k8s, name, None)
    if cls is None:
        raise SchemaError(f"no model class {name} in kserve or kubernetes.client")
    return cls


def build(value, type_name: str, path: str):
    """The model object of `type_name` built from `value`; SchemaError names the first field
    the schema lacks or whose value has the wrong type."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {value!r}")
        return [build(v, type_name[5:-1], f"{path}[{i}]") for i, v in enumerate(value)]
    if type_name.startswith(("dict(", "dict[")):  # kserve writes dict(str, X), kubernetes dict[str, X]
        inner = type_name[type_name.index(",") + 1:-1].strip()
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise SchemaError(f"{path}: expected a mapping with string keys, got {value!r}")
        return {k: build(v, inner, f"{path}.{k}") for k, v in value.items()}
    if type_name == "object":  # IntOrString, free-form status
        return value
    if type_name in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[type_name]) or (type_name != "bool" and isinstance(value, bool)):
            raise SchemaError(f"{path}: expected {type_name}, got {value!r}")
        return value
    cls = model_class(type_name)
    if not isinstance(value, dict):
        raise SchemaError(f"{path}: expected an object ({type_name}), got {value!r}")
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    kwargs = {}
    for key, item in value.items():
        if key not in fields:
            raise SchemaError(f"{path}.{key}: {type_name} has no such field (it has: {', '.join(sorted(fields))})")
        kwargs[fields[key]] = build(item, cls.openapi_types[fields[key]], f"{path}.{key}")
    try:
        return cls(**kwargs)
    except ValueError as e:  # a required field missing, a value outside an enum
        raise SchemaError(f"{path}: {e}") from None


def check(path: str) -> list[dict]:
    results = []
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for index, doc in enumerate(docs):
        kind = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
        error = None
        try:
            if kind is None:
                raise SchemaError(f"unexpected kind {doc.get('apiVersion')} {doc.get('kind')}")
            if not isinstance(build(doc, kind, doc["kind"]), model_class(kind)):
                raise SchemaError(f"did not build a {kind}")
        except SchemaError as e:
            error = str(e)
        results.append({"source": path, "index": index, "kind": kind, "error": error})
    return results


if __name__ == "__main__":
    print(json.dumps([r for path in sys.argv[1:] for r in check(path)]))
