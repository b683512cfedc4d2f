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
  Kubernetes 1.34) are checked for the versions in VERSIONS from that one on, and for it;
- every kustomization (the base and each overlay) is rendered as `kubectl apply -k` would apply
  it (resources, then its inline patches: strategic merge by the keys Kubernetes merges pod
  specs on, `$patch: delete`, `null` removing a field) and the result is held to the security
  invariants in check_secure (docs/threat-model.md): mutual TLS on every controller and agent,
  etcd over TLS with client certificates, NetworkPolicies in front of every listening port, the
  webhook requiring client certificates and keeping kube-system out, every Secret a pod mounts
  made by a Certificate. An overlay whose directory name says `insecure` may serve plain text;
  no other may. A binary told to serve Prometheus beyond loopback (`--prometheus-listen`,
  GPUWARDEN_PROMETHEUS_LISTEN, `prometheus_listen`) must be allowed to (`--prometheus-insecure`,
  GPUWARDEN_PROMETHEUS_INSECURE=true, `prometheus_insecure = true`), else it refuses to start,
  and must declare the port, so that a NetworkPolicy is required in front of it. Kinds from outside Kubernetes (cert-manager's) are checked against vendored
  schemas above; a kind with neither a bundled nor a vendored schema fails, by name.
- the workloads shown in docs/kubernetes.md (every `yaml` block whose kind is a Pod or a
  workload) pass the schemas and the API server's container resource rules (check_resources:
  extended resources are whole numbers, a request equals its limit, no request without one);
  the rule is first shown refusing `gpuwarden.io/gpu-shares: "0.5"` in a Deployment, so it can
  fail.

Usage: validate.py [DIR]   (default: the directory of this script)
Exits 1 naming file, document and error when anything fails; the last line is always
`validate: N passed, M failed` (N + M = the number of documents).
"""

from __future__ import annotations

import ipaddress
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


# ---- overlays, rendered ------------------------------------------------------------------------

# Lists Kubernetes merges element by element in a strategic merge patch, by their merge key
# (k8s.io/api core/v1 patchMergeKey tags); every other list is replaced whole.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
    "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name",
}


def merge(base, patch, field: str | None = None):
    """A strategic merge patch of `patch` onto `base` (the subset the manifests use)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if key == "$patch":
                continue
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = value
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out = list(base)
        for item in patch:
            found = next((i for i, b in enumerate(out)
                          if isinstance(b, dict) and isinstance(item, dict) and b.get(key) == item.get(key)), None)
            if found is None:
                out.append(item)
            else:
                out[found] = merge(out[found], item, None)
        return out
    return patch


def identity(data: dict) -> tuple[str, str | None, str]:
    meta = data.get("metadata") or {}
    return (str(data.get("kind")), meta.get("namespace"), str(meta.get("name")))


def render(directory: Path, seen: frozenset = frozenset()) -> tuple[list[dict], list[str]]:
    """The objects `kubectl apply -k directory` applies, and what could not be rendered."""
    errors: list[str] = []
    path = next((directory / n for n in KUSTOMIZATION_NAMES if (directory / n).exists()), None)
    if path is None or directory in seen:
        return [], [f"{directory}: no kustomization (or a cycle)"]
    kustomization = yaml.safe_load(path.read_text()) or {}
    objects: list[dict] = []
    for entry in kustomization.get("resources") or []:
        target = (directory / entry).resolve()
        if target.is_dir():
            rendered, more = render(target, seen | {directory})
            objects += rendered
            errors += more
        elif target.exists():
            objects += [d for d in yaml.safe_load_all(target.read_text()) if isinstance(d, dict)]
    for patch in kustomization.get("patches") or []:
        text = patch.get("patch") if isinstance(patch, dict) else None
        if text is None:
            errors.append(f"{path}: only inline `patch:` entries are rendered here")
            continue
        body = yaml.safe_load(text)
        key = identity(body)
        index = next((i for i, o in enumerate(objects) if identity(o) == key), None)
        if index is None:
            errors.append(f"{path}: a patch targets {key}, which the resources lack")
        elif body.get("$patch") == "delete":
            del objects[index]
        else:
            objects[index] = merge(objects[index], body)
    labels = {}
    for entry in kustomization.get("labels") or []:
        if entry.get("includeTemplates"):
            labels.update(entry.get("pairs") or {})
    for obj in objects:
        template = (obj.get("spec") or {}).get("template")
        if obj.get("kind") in POD_TEMPLATE_KINDS and isinstance(template, dict):
            template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    return objects, errors


def container_flags(container: dict) -> list[str]:
    return [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]


def has_flag(flags: list[str], name: str) -> bool:
    return any(f == name or f.startswith(name + "=") for f in flags)


def flag_value(flags: list[str], name: str) -> str | None:
    for i, f in enumerate(flags):
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
    return None


def env_value(container: dict, name: str) -> str | None:
    return next((e.get("value") for e in container.get("env") or [] if e.get("name") == name), None)


def is_loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        # $(POD_IP) or a name: a pod address, beyond loopback.
        return False


def check_prometheus(where: str, flags: list[str], container: dict, configs: list[dict]) -> list[str]:
    """The binaries refuse to serve their unauthenticated Prometheus endpoint beyond loopback
    unless allowed (docs/metrics.md, "Prometheus"): a manifest that asks for it must allow it, or
    its pods never start, and must declare the port, so check_secure requires a NetworkPolicy."""
    listen = (flag_value(flags, "--prometheus-listen")
              or env_value(container, "GPUWARDEN_PROMETHEUS_LISTEN")
              or next((str(c["prometheus_listen"]) for c in configs if c.get("prometheus_listen")), None))
    if not listen or is_loopback(listen):
        return []
    errors = []
    allowed = (any(f == "--prometheus-insecure" or f == "--prometheus-insecure=true" for f in flags)
               or has_flag(flags, "--insecure")
               or (env_value(container, "GPUWARDEN_PROMETHEUS_INSECURE") or "").lower() == "true"
               or any(c.get("prometheus_insecure") is True for c in configs))
    if not allowed:
        errors.append(f"{where}: Prometheus on {listen} beyond loopback without --prometheus-insecure "
                      "(GPUWARDEN_PROMETHEUS_INSECURE=true): the binary refuses to start")
    port = listen.rsplit(":", 1)[-1]
    if not any(str(p.get("containerPort")) == port for p in container.get("ports") or []):
        errors.append(f"{where}: the Prometheus port {port} is not among the container's ports "
                      "(declare it, so that a NetworkPolicy must guard it)")
    return errors


def selects(policy: dict, labels: dict) -> bool:
    wanted = ((policy.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def check_secure(name: str, objects: list[dict]) -> list[str]:
    """The security invariants of one rendered kustomization; the breaches, each named."""
    insecure_allowed = "insecure" in name
    errors: list[str] = []
    by_kind: dict[str, list[dict]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind")), []).append(obj)
    policies = by_kind.get("NetworkPolicy", [])
    certificates = {
        (c.get("spec") or {}).get("secretName") for c in by_kind.get("Certificate", [])
    }
    agent_configs = [
        text for cm in by_kind.get("ConfigMap", [])
        for key, text in (cm.get("data") or {}).items()
        if cm["metadata"]["name"] == "gpuwarden-agent-config" and key.endswith(".toml")
    ]
    controllers = 0
    for obj in objects:
        if obj.get("kind") not in POD_TEMPLATE_KINDS:
            continue
        template = (obj.get("spec") or {}).get("template") or {}
        spec = template.get("spec") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        for volume in spec.get("volumes") or []:
            secret = (volume.get("secret") or {}).get("secretName")
            if secret and secret not in certificates:
                errors.append(f"{where} mounts Secret {secret!r}, which no Certificate makes")
        for container in spec.get("containers") or []:
            flags = container_flags(container)
            command = flags[0] if flags else ""
            if command == "gpuwarden-controller":
                controllers += 1
                if has_flag(flags, "--insecure") and not insecure_allowed:
                    errors.append(f"{where}: --insecure outside an overlay named insecure")
                tls = all(has_flag(flags, f) for f in ("--tls-cert", "--tls-key", "--tls-client-ca"))
                if not tls and not insecure_allowed:
                    errors.append(f"{where}: the gRPC port serves without --tls-cert, --tls-key and --tls-client-ca")
                store = flag_value(flags, "--store") or ""
                if store.startswith("etcd") and not all(
                    has_flag(flags, f) for f in ("--etcd-ca", "--etcd-cert", "--etcd-key")
                ):
                    errors.append(f"{where}: etcd without TLS client certificates (--etcd-ca, --etcd-cert, --etcd-key)")
                if has_flag(flags, "--webhook-listen") and not has_flag(flags, "--webhook-client-ca") and not insecure_allowed:
                    errors.append(f"{where}: the webhook takes clients without a certificate (--webhook-client-ca)")
                if has_flag(flags, "--extender-listen") and not insecure_allowed:
                    errors.append(f"{where}: --extender-listen serves plain HTTP")
            if command in ("gpuwarden-agent", "gpuwarden-controller"):
                configs = [tomllib.loads(t) for t in agent_configs] if command == "gpuwarden-agent" else []
                errors += check_prometheus(where, flags, container, configs)
            if command == "gpuwarden-agent":
                urls = [e.get("value", "") for e in container.get("env") or [] if e.get("name") == "GPUWARDEN_CONTROLLER"]
                for text in agent_configs:
                    config = tomllib.loads(text)
                    urls.append(str(config.get("controller", "")))
                    by_flags = all(has_flag(flags, f) for f in ("--controller-ca", "--tls-cert", "--tls-key"))
                    by_config = all(config.get(k) for k in ("controller_ca", "tls_cert", "tls_key"))
                    if not (by_flags or by_config) and not insecure_allowed:
                        errors.append(f"{where}: agent.toml lacks controller_ca, tls_cert or tls_key")
                for url in ",".join(urls).split(","):
                    if url.strip() and not url.strip().startswith("https://") and not insecure_allowed:
                        errors.append(f"{where}: the agent dials {url.strip()!r} without TLS")
            for port in container.get("ports") or []:
                number = port.get("containerPort")
                guarded = [p for p in policies if selects(p, labels)]
                allowed = [
                    rule for p in guarded for rule in (p["spec"].get("ingress") or [])
                    if not rule.get("ports") or any(rp.get("port") in (number, port.get("name")) for rp in rule["ports"])
                ]
                if not guarded:
                    errors.append(f"{where}: port {number} has no NetworkPolicy in front of it")
                for rule in allowed:
                    if not rule.get("from"):
                        errors.append(f"{where}: a NetworkPolicy opens port {number} to every source")
    if controllers == 0:
        errors.append("no gpuwarden-controller container")
    for hook in by_kind.get("MutatingWebhookConfiguration", []):
        for webhook in hook.get("webhooks") or []:
            selector = webhook.get("namespaceSelector") or {}
            kept_out = any(
                e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn"
                and "kube-system" in (e.get("values") or [])
                for e in selector.get("matchExpressions") or []
            )
            if not kept_out:
                errors.append(f"MutatingWebhookConfiguration/{hook['metadata']['name']}: {webhook.get('name')} reaches kube-system")
    return errors


# Transcribed from kubernetes/kubernetes, pkg/apis/core/validation/validation.go
# (ValidateResourceRequirements, ValidateResourceQuantityValue, ValidateNonnegativeQuantity) and
# pkg/apis/core/helper/helpers.go (IsNativeResource, IsExtendedResourceName,
# IsIntegerResourceName, IsOvercommitAllowed, IsHugePageResourceName); the same from release-1.26
# through release-1.36.
def parse_quantity(value) -> "Fraction | None":
    """A resource.Quantity's value, exactly (decimal and binary SI, exponents); None if malformed."""
    import re
    from fractions import Fraction
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    m = re.fullmatch(r"([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|n|u|m|k|M|G|T|P|E|)",
                     str(value))
    if not m:
        return None
    sign, number, suffix = m.groups()
    v = Fraction(number)
    binary = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
    decimal = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    if suffix in binary:
        v *= 2 ** binary[suffix]
    elif suffix in decimal:
        v *= Fraction(10) ** decimal[suffix]
    else:
        v *= Fraction(10) ** int(suffix[1:])
    return -v if sign == "-" else v


def is_native_resource(name: str) -> bool:
    # IsNativeResource: no domain prefix, or one in kubernetes.io.
    return "/" not in name or "kubernetes.io/" in name


def is_extended_resource(name: str) -> bool:
    # IsExtendedResourceName: not native and not "requests."-prefixed (a quota name).
    return not is_native_resource(name) and not name.startswith("requests.")


def check_resources(where: str, spec: dict) -> list[str]:
    """What the API server refuses in a pod spec's container resources."""
    import math
    errors = []
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    for c in containers:
        resources = c.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        at = f"{where}: container {c.get('name')!r}"
        for kind, values in (("limits", limits), ("requests", requests)):
            for name, value in values.items():
                q = parse_quantity(value)
                if q is None:
                    errors.append(f"{at}: {kind}[{name}]: {value!r} is no quantity")
                    continue
                if q < 0:
                    errors.append(f"{at}: {kind}[{name}]: must be greater than or equal to 0")
                # IsIntegerResourceName → `value.MilliValue()%1000 != 0` (MilliValue rounds up).
                if is_extended_resource(name) and math.ceil(q * 1000) % 1000 != 0:
                    errors.append(f"{at}: {kind}[{name}]: Invalid value: {value!r}: must be an integer")
        for name, value in requests.items():
            overcommit = is_native_resource(name) and not name.startswith("hugepages-")
            if name in limits:
                if (not overcommit and parse_quantity(value) != parse_quantity(limits[name])):
                    errors.append(f"{at}: requests[{name}]: must be equal to {name} limit")
            elif not overcommit:
                errors.append(f"{at}: limits: Limit must be set for non overcommitable resources")
    return errors


def check_docs(root: Path) -> list[str]:
    """The Pods and workloads docs/kubernetes.md shows: schemas, and the resource rules."""
    import re
    doc_path = root.parent.parent / "docs" / "kubernetes.md"
    if not doc_path.is_file():
        return []
    # The rule can fail: it refuses the older fractional limit in a Deployment.
    refused = check_resources("self-test", {"containers": [{"name": "c", "resources": {
        "limits": {"gpuwarden.io/gpu-shares": "0.5"}}}]})
    failures = [] if refused else ["FAIL docs: the resource rule accepted gpu-shares 0.5"]
    kinds = {"Pod"} | set(POD_TEMPLATE_KINDS)
    blocks = re.findall(r"^```yaml\n(.*?)^```", doc_path.read_text(), re.S | re.M)
    checked = 0
    for i, block in enumerate(blocks):
        try:
            data = yaml.safe_load(block)
        except yaml.YAMLError as e:
            failures.append(f"FAIL docs/kubernetes.md yaml block {i + 1}: not YAML: {e}")
            continue
        if not isinstance(data, dict) or data.get("kind") not in kinds:
            continue
        where = f"docs/kubernetes.md yaml block {i + 1} ({data['kind']})"
        spec = data.get("spec") or {}
        if data["kind"] == "CronJob":
            spec = ((spec.get("jobTemplate") or {}).get("spec") or {})
        if data["kind"] != "Pod":
            spec = ((spec.get("template") or {}).get("spec") or {})
        for version in VERSIONS[-1:]:
            try:
                kubernetes_validate.validate(data, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"FAIL {where}: Kubernetes {version}: {e.message}")
        failures += [f"FAIL {e}" for e in check_resources(where, spec)]
        checked += 1
    print(f"validate: {checked} workloads of docs/kubernetes.md checked against the resource rules")
    return failures


def check_overlays(root: Path) -> list[str]:
    """Renders every kustomization under root and checks it; one line per breach."""
    failures = []
    directories = sorted({p.parent for p in root.rglob("*") if p.name in KUSTOMIZATION_NAMES})
    for directory in directories:
        name = str(directory.relative_to(root)) if directory != root else "(base)"
        objects, errors = render(directory)
        errors += check_secure(name, objects)
        for error in errors:
            failures.append(f"FAIL overlay {name}: {error}")
        if not errors:
            print(f"ok   overlay {name}: {len(objects)} objects, secure")
    return failures


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
    overlay_failures = check_overlays(root) + check_docs(root)
    for doc in docs:
        if doc.errors:
            for error in doc.errors:
                print(f"FAIL {doc.where(root)}: {error}")
        else:
            print(f"ok   {doc.where(root)}")
    versions = ", ".join(VERSIONS)
    print(f"validate: checked against Kubernetes {versions} (kubernetes-validate "
          f"{kubernetes_validate.__version__}, strict)")
    for line in overlay_failures:
        print(line)
    print(f"validate: {len(docs) - len(failed)} passed, {len(failed) + len(broken)} failed"
          + (f", {len(overlay_failures)} overlay breaches" if overlay_failures else ""))
    return 1 if failed or broken or overlay_failures or not docs else 0


if __name__ == "__main__":
    sys.exit(main())
