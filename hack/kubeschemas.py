"""Write JSON schemas that kubeconform validates manifests against, with no network access.

kubeconform's default schemas live on GitHub; CI cannot reach it and our CRD is not there anyway. This
writes one standalone, strict JSON schema per kind into OUT_DIR, laid out for the schema location

    OUT_DIR/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json

(Group is the API group, or "v1" for the core group; ResourceKind is lowercase), from

* the Kubernetes OpenAPI v3 documents shipped in the k8s.io/kubernetes module
  (api/openapi-spec/v3, found with `go mod download -json`; --openapi-dir overrides), and
* CustomResourceDefinition files (--crd), from each served version's openAPIV3Schema.

"Strict" means an object with declared properties rejects unknown ones, like kubectl's field
validation: a typo in a chart template or an example fails instead of being dropped silently.

    python hack/kubeschemas.py OUT_DIR --crd crds/nvidia.com_dynamographdeployments.yaml
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

K8S_VERSION = "1.36.3"  # keep in step with hack/build-binaries.sh
REF_PREFIX = "#/components/schemas/"
# OpenAPI "formats" that stand for values of more than one JSON type.
SPECIAL = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"anyOf": [{"type": "string"}, {"type": "number"}]},
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
}


def to_json_schema(node: Any) -> Any:
    """Translate an OpenAPI v3 / CRD structural schema node into strict JSON schema."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in ("properties", "patternProperties", "definitions") and isinstance(value, dict):
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}  # names, not keywords
        else:
            out[key] = to_json_schema(value)
    if isinstance(out.get("$ref"), str) and out["$ref"].startswith(REF_PREFIX):
        out["$ref"] = "#/definitions/" + out["$ref"][len(REF_PREFIX) :]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "string"}, {"type": "integer"}]
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF_PREFIX):
            found.add(ref[len(REF_PREFIX) :])
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def _closure(name: str, schemas: dict[str, Any]) -> list[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in schemas:
            continue
        seen.add(current)
        todo.extend(_refs(schemas[current]))
    return sorted(seen)


def _path(out_dir: Path, group: str, version: str, kind: str) -> Path:
    return out_dir / (group or "v1") / f"{kind.lower()}_{version}.json"


def builtin_schemas(openapi_dir: Path, out_dir: Path) -> int:
    """Write a schema for every kind in the Kubernetes OpenAPI v3 documents; returns how many."""
    schemas: dict[str, Any] = {}
    for doc in sorted(openapi_dir.glob("*_openapi.json")):
        schemas.update(json.loads(doc.read_text()).get("components", {}).get("schemas", {}))
    converted = {name: SPECIAL.get(name) or to_json_schema(schema) for name, schema in schemas.items()}
    count = 0
    for name, schema in schemas.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            definitions = {dep: converted[dep] for dep in _closure(name, schemas)}
            doc = {"$ref": f"#/definitions/{name}", "definitions": definitions}
            path = _path(out_dir, gvk["group"], gvk["version"], gvk["kind"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc))
            count += 1
    return count


def crd_schemas(crd_file: Path, out_dir: Path) -> int:
    """Write a schema for every served version of every CRD in ``crd_file``; returns how many."""
    count = 0
    for crd in yaml.safe_load_all(crd_file.read_text()):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            doc = to_json_schema(schema)
            doc["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the apiserver's business
            path = _path(out_dir, group, version["name"], kind)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc))
            count += 1
    return count


def find_openapi_dir(version: str = K8S_VERSION) -> Path:
    """The api/openapi-spec/v3 folder of k8s.io/kubernetes@v<version>, downloaded through the Go proxy."""
    try:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise SystemExit(
            f"error: could not fetch k8s.io/kubernetes@v{version} with `go mod download` ({exc}); "
            "install Go or pass --openapi-dir pointing at a Kubernetes api/openapi-spec/v3 folder"
        ) from exc
    return Path(json.loads(result.stdout)["Dir"]) / "api" / "openapi-spec" / "v3"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path, help="folder to write the schemas into")
    parser.add_argument("--crd", type=Path, action="append", default=[], help="a CRD YAML file (repeatable)")
    parser.add_argument("--openapi-dir", type=Path, help="Kubernetes api/openapi-spec/v3 folder")
    parser.add_argument("--no-builtin", action="store_true", help="write only the CRD schemas")
    args = parser.parse_args(argv)
    count = 0
    if not args.no_builtin:
        count += builtin_schemas(args.openapi_dir or find_openapi_dir(), args.out_dir)
    for crd in args.crd:
        count += crd_schemas(crd, args.out_dir)
    print(f"wrote {count} schemas into {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
