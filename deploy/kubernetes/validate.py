#!/usr/bin/env python3
"""Validates the Kubernetes manifests offline (what `cargo xtask test` runs).

Every YAML document under deploy/kubernetes is checked against the Kubernetes OpenAPI schemas
bundled in the PyPI package `kubernetes-validate` (no cluster, no network), in strict mode so
that an unknown or misspelt field fails, for each Kubernetes version in VERSIONS. Beyond the
schemas:

- a Kustomization must list only files that exist, and every manifest file here must be listed
  in one (so nothing is validated that `kubectl apply -k` would not apply);
- a kind the bundled schemas do not know fails (it would otherwise be skipped unchecked);
- no two documents share kind, namespace and name;
- a pod template's ConfigMaps, PersistentVolumeClaims and ServiceAccount exist among the
  manifests, each (Cluster)RoleBinding's role and ServiceAccount subjects too, and each Service
  selects some pod template;
- the files embedded in ConfigMaps parse (TOML, YAML), and an embedded KubeSchedulerConfiguration
  uses only the fields kube-scheduler's config/v1 types have;
- kinds the bundled schemas lack (cert-manager's Certificate and Issuer) are checked against the
  schemas vendored in schemas/ (each names its source), strictly as well;
- documents under a directory in MIN_VERSIONS (the DRA overlay: resource.k8s.io/v1 exists from
  Kubernetes 1.34) are checked for the versions in VERSIONS from that one on, and for it.

Usage: validate.py [DIR]   (default: the directory of this script)
Exits 1 naming file, document and error when anything fails; the last line is always
`validate: N passed, M failed` (N + M = the number of documents).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import yaml
import jsonschema
from kubernetes_validate.utils import VersionNotSupportedError

# The Kubernetes versions the manifests must be valid for: the oldest supported and the newest
# the pinned kubernetes-validate bundles.
VERSIONS = ("1.31", "1.37")

# Directories (relative to the root) whose manifests need a newer Kubernetes, and the oldest
# version they are checked for: the DRA overlay's DeviceClass and ValidatingAdmissionPolicy
# bindings of resource.k8s.io/v1 exist from 1.34 (DRA GA).
MIN_VERSIONS = {"dra": "1.34"}

# Schemas of kinds outside Kubernetes, by (apiVersion, kind): JSON files in schemas/, each with a
# $comment naming the CRD and commit it was taken from.
VENDORED = {
    ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1.json",
    ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1.json",
}

# kube-scheduler's config/v1 types (k8s.io/kube-scheduler config/v1/types.go, at
# e87dbddd27a5bd4c2028727c7ccc082cfb2cdc09): the JSON fields of KubeSchedulerConfiguration
# (TypeMeta and DebuggingConfiguration inlined), Extender and ExtenderTLSConfig.
SCHEDULER_FIELDS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
    "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
    "delayCacheUntilActive",
}
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
EXTENDER_TLS_FIELDS = {
    "insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData",
}

KUSTOMIZATION_NAMES = {"kustomization.yaml", "kustomization.yml", "Kustomization"}
POD_TEMPLATE_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}


class Doc:
    """One YAML document and where it came from."""

    def __init__(self, path: Path, index: int, data: dict):
        self.path = path
        self.index = index
        self.data = data
        self.errors: list[str] = []

    @property
    def kind(self) -> str:
        return str(self.data.get("kind", "?"))

    @property
    def name(self) -> str:
        return str((self.data.get("metadata") or {}).get("name", "?"))

    @property
    def namespace(self) -> str | None:
        return (self.data.get("metadata") or {}).get("namespace")

    def where(self, root: Path) -> str:
        what = self.kind if self.name == "?" else f"{self.kind}/{self.name}"
        return f"{self.path.relative_to(root)} document {self.index + 1} ({what})"


def load(root: Path) -> tuple[list[Doc], list[str]]:
    """Every non-empty document of every YAML file under `root`, and the files that don't parse."""
    docs: list[Doc] = []
    broken: list[str] = []
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    for path in files:
        try:
            parsed = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as e:
            broken.append(f"{path.relative_to(root)}: not YAML: {e}")
            continue
        for index, data in enumerate(parsed):
            if data is None:
                continue
            doc = Doc(path, index, data if isinstance(data, dict) else {})
            if not isinstance(data, dict):
                doc.errors.append("not a mapping")
            docs.append(doc)
    return docs, broken


def is_kustomization(doc: Doc) -> bool:
    return doc.kind == "Kustomization" or doc.path.name in KUSTOMIZATION_NAMES


def check_kustomizations(docs: list[Doc], root: Path) -> None:
    """Listed files exist; every manifest file is listed by some kustomization."""
    listed: set[Path] = set()
    for doc in filter(is_kustomization, docs):
        base = doc.path.parent
        for key in ("resources", "components", "crds"):
            for entry in doc.data.get(key) or []:
                target = (base / entry).resolve()
                if not target.exists():
                    doc.errors.append(f"{key} lists {entry!r}, which does not exist")
                elif target.is_dir():
                    listed.update(p.resolve() for p in target.rglob("*") if p.is_file())
                else:
                    listed.add(target)
        for patch in doc.data.get("patches") or []:
            if isinstance(patch, dict) and "path" in patch and not (base / patch["path"]).exists():
                doc.errors.append(f"patches lists {patch['path']!r}, which does not exist")
    for doc in docs:
        if not is_kustomization(doc) and doc.path.resolve() not in listed:
            doc.errors.append(
                f"{doc.path.relative_to(root)} is in no kustomization: `kubectl apply -k` skips it"
            )


def versions_for(doc: Doc, root: Path) -> list[str]:
    """VERSIONS, from the directory's minimum on (with the minimum itself)."""
    top = doc.path.relative_to(root).parts[0]
    oldest = MIN_VERSIONS.get(top)
    if oldest is None:
        return list(VERSIONS)
    key = lambda v: tuple(int(p) for p in v.split("."))
    newer = [v for v in VERSIONS if key(v) > key(oldest)]
    return [oldest, *newer]


def check_vendored(doc: Doc, root: Path, name: str) -> None:
    """A kind from outside Kubernetes against its vendored schema."""
    schema = json.loads((root / "schemas" / name).read_text())
    validator = jsonschema.Draft7Validator(schema)
    for error in sorted(validator.iter_errors(doc.data), key=lambda e: list(e.path)):
        path = ".".join(str(p) for p in error.path) or "(top)"
        doc.errors.append(f"schemas/{name}: {path}: {error.message}")


def check_schema(doc: Doc, root: Path) -> None:
    """Strict OpenAPI schema validation for every version the document is for."""
    if "apiVersion" not in doc.data or "kind" not in doc.data:
        doc.errors.append("no apiVersion or kind")
        return
    vendored = VENDORED.get((doc.data["apiVersion"], doc.data["kind"]))
    if vendored:
        check_vendored(doc, root, vendored)
        return
    for version in versions_for(doc, root):
        try:
            kubernetes_validate.validate(doc.data, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(top)"
            doc.errors.append(f"Kubernetes {version}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            doc.errors.append(f"Kubernetes {version}: {e.message}")
        except VersionNotSupportedError:
            doc.errors.append(f"kubernetes-validate does not know Kubernetes {version}")


def pod_spec(doc: Doc) -> dict | None:
    if doc.kind in POD_TEMPLATE_KINDS:
        return ((doc.data.get("spec") or {}).get("template") or {}).get("spec")
    return None


def check_references(docs: list[Doc]) -> None:
    """Names a pod template uses exist; Services select something; no duplicates."""
    seen: dict[tuple[str, str | None, str], Doc] = {}
    for doc in docs:
        if is_kustomization(doc):
            continue
        key = (doc.kind, doc.namespace, doc.name)
        if key in seen:
            doc.errors.append(f"same kind, namespace and name as {seen[key].path.name}")
        seen.setdefault(key, doc)

    def exists(kind: str, namespace: str | None, name: str) -> bool:
        return (kind, namespace, name) in seen

    templates: list[tuple[str | None, dict]] = []
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        ns = doc.namespace
        labels = ((doc.data["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
        templates.append((ns, labels))
        account = spec.get("serviceAccountName")
        if account and not exists("ServiceAccount", ns, account):
            doc.errors.append(f"ServiceAccount {account!r} is not among the manifests")
        for volume in spec.get("volumes") or []:
            if "configMap" in volume:
                name = volume["configMap"].get("name")
                if not exists("ConfigMap", ns, name):
                    doc.errors.append(f"ConfigMap {name!r} is not among the manifests")
            if "persistentVolumeClaim" in volume:
                name = volume["persistentVolumeClaim"].get("claimName")
                if not exists("PersistentVolumeClaim", ns, name):
                    doc.errors.append(f"PersistentVolumeClaim {name!r} is not among the manifests")
    for doc in docs:
        if doc.kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = doc.data.get("roleRef") or {}
        role_ns = doc.namespace if ref.get("kind") == "Role" else None
        if not exists(str(ref.get("kind")), role_ns, str(ref.get("name"))):
            doc.errors.append(f"roleRef {ref.get('kind')} {ref.get('name')!r} is not among the manifests")
        for subject in doc.data.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount" and not exists(
                "ServiceAccount", subject.get("namespace"), subject.get("name")
            ):
                doc.errors.append(f"subject ServiceAccount {subject.get('name')!r} is not among the manifests")
    for doc in docs:
        if doc.kind != "Service":
            continue
        selector = (doc.data.get("spec") or {}).get("selector") or {}
        if selector and not any(
            ns == doc.namespace and all(labels.get(k) == v for k, v in selector.items())
            for ns, labels in templates
        ):
            doc.errors.append(f"selector {selector} matches no pod template")


def check_embedded(doc: Doc) -> None:
    """Files carried in a ConfigMap parse."""
    if doc.kind != "ConfigMap":
        return
    for name, text in (doc.data.get("data") or {}).items():
        try:
            if name.endswith(".toml"):
                tomllib.loads(text)
            elif name.endswith((".yaml", ".yml")):
                embedded = yaml.safe_load(text)
                if isinstance(embedded, dict) and embedded.get("kind") == "KubeSchedulerConfiguration":
                    check_scheduler_config(doc, name, embedded)
        except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
            doc.errors.append(f"data.{name} does not parse: {e}")


def check_scheduler_config(doc: Doc, name: str, config: dict) -> None:
    """Only fields kube-scheduler's config/v1 types have (it refuses unknown ones)."""
    if config.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        doc.errors.append(f"data.{name}: apiVersion must be kubescheduler.config.k8s.io/v1")
    for key in sorted(set(config) - SCHEDULER_FIELDS):
        doc.errors.append(f"data.{name}: unknown KubeSchedulerConfiguration field {key!r}")
    for i, extender in enumerate(config.get("extenders") or []):
        for key in sorted(set(extender) - EXTENDER_FIELDS):
            doc.errors.append(f"data.{name}: extenders[{i}]: unknown field {key!r}")
        if "urlPrefix" not in extender:
            doc.errors.append(f"data.{name}: extenders[{i}]: no urlPrefix")
        for key in sorted(set(extender.get("tlsConfig") or {}) - EXTENDER_TLS_FIELDS):
            doc.errors.append(f"data.{name}: extenders[{i}].tlsConfig: unknown field {key!r}")


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent).resolve()
    docs, broken = load(root)
    for line in broken:
        print(f"FAIL {line}")
    check_kustomizations(docs, root)
    check_references(docs)
    for doc in docs:
        if not is_kustomization(doc):
            check_schema(doc, root)
        check_embedded(doc)
    failed = [d for d in docs if d.errors]
    for doc in docs:
        if doc.errors:
            for error in doc.errors:
                print(f"FAIL {doc.where(root)}: {error}")
        else:
            print(f"ok   {doc.where(root)}")
    versions = ", ".join(VERSIONS)
    print(f"validate: checked against Kubernetes {versions} (kubernetes-validate "
          f"{kubernetes_validate.__version__}, strict)")
    print(f"validate: {len(docs) - len(failed)} passed, {len(failed) + len(broken)} failed")
    return 1 if failed or broken or not docs else 0


if __name__ == "__main__":
    sys.exit(main())
