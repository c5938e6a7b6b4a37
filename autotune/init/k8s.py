"""Kubernetes workloads as they run today: the serving container of each pod template.

Read from a (multi-document) manifest: ``Deployment``, ``StatefulSet`` (apps/v1,
``spec.template``), ``LeaderWorkerSet`` (leaderworkerset.x-k8s.io/v1: the leader's template,
whose process serves; its workers join it and are not imported) and a bare ``Pod``. Other
kinds (``Service``, ``ConfigMap``, ...) are skipped. In each pod the container whose command
runs an engine autotune knows is the service (sidecars are skipped and said); with none, the
pod's only container.

A container's argv is ``command`` + ``args`` with Kubernetes' ``$(VAR)`` references expanded
from its ``env`` (``$$(VAR)`` stays literal). ``env`` values come along; ``valueFrom:
secretKeyRef`` becomes a reference the deployment resolves when it runs (``${env:VAR}``); a
ConfigMap key, a field or a resource reference is an error (the cluster holds its value), and
``envFrom`` is said (its variables are not listed here: export them where autotune runs).
The readiness probe's HTTP path, the ``nvidia.com/gpu`` limit, ``workingDir`` and the labels and
annotations of an exported winner (``autotune.io/service``, ``study``, ``trial``) are kept.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError
from autotune.export.credentials import FLAG_PREFIX
from autotune.init.engines import find_program
from autotune.init.model import RawService
from autotune.init.secrets import reference
from autotune.yamlio import read_text

_KUBE_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_SERVICE_LABEL = "autotune.io/service"


def read_k8s(path: Path) -> list[RawService]:
    """The serving container of every workload in ``path`` (a file, or every ``*.yaml`` /
    ``*.yml`` of a directory in name order, as ``kubectl apply -f DIR`` reads it)."""
    files = (
        sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        if path.is_dir()
        else [path]
    )
    docs: list[Any] = []
    for file in files:
        try:
            docs += [d for d in yaml.safe_load_all(read_text(file)) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read it: {exc}", file=str(file)) from None
    out: list[RawService] = []
    skipped: list[str] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ConfigError("expected a mapping", file=str(path), field=f"document {i + 1}")
        kind = str(doc.get("kind", ""))
        meta = doc.get("metadata") or {}
        where = f"{kind} {meta.get('name', '?')}"
        templates = _templates(doc)
        if templates is None:
            skipped.append(where)
            continue
        for role, template in templates:
            out.append(_service(path, doc, template, where=where, role=role))
    if not out:
        raise ConfigError(
            "no Deployment, StatefulSet, LeaderWorkerSet or Pod in the file"
            + (f" (found {', '.join(skipped)})" if skipped else ""),
            file=str(path),
        )
    if skipped and out:
        out[0].notes.append(f"{path.name}: skipped {', '.join(skipped)} (not a workload)")
    return out


def _templates(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """(role, pod template) of a workload; ``None`` for other kinds."""
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"):
        return [("", spec.get("template") or {})]
    if kind == "LeaderWorkerSet":
        lws = spec.get("leaderWorkerTemplate") or {}
        leader = lws.get("leaderTemplate") or lws.get("workerTemplate") or {}
        return [("leader", leader)]
    if kind == "Pod":
        return [("", {"metadata": doc.get("metadata") or {}, "spec": spec})]
    return None


def _service(
    path: Path, doc: dict[str, Any], template: dict[str, Any], *, where: str, role: str
) -> RawService:
    file = str(path)
    pod = template.get("spec") or {}
    containers = [c for c in pod.get("containers") or [] if isinstance(c, dict)]
    if not containers:
        raise ConfigError(f"{where}: no containers", file=file, field="spec.containers")
    serving = [c for c in containers if find_program(_plain_argv(c)) is not None]
    if len(serving) > 1:
        names = ", ".join(str(c.get("name")) for c in serving)
        raise ConfigError(
            f"{where}: several containers run a serving engine ({names}): split them into "
            "workloads of their own to import them",
            file=file,
        )
    if not serving and len(containers) > 1:
        raise ConfigError(
            f"{where}: none of its {len(containers)} containers runs an engine autotune knows: "
            "keep only the serving container to import it",
            file=file,
        )
    container = (serving or containers)[0]
    name = str(container.get("name") or "server")
    origin = f"{where} container {name} ({path.name})"
    env, refs, origin_of = _env(container, origin=origin, file=file)
    used: set[str] = set()
    argv = [_expand(w, env, used) for w in _plain_argv(container)]
    for name in used & refs:
        if name.startswith(FLAG_PREFIX):
            # `best --export k8s` carries a secret flag's value in this variable only for
            # `$(VAR)` in args; resolved there, it is not part of the service's environment.
            del env[name]
    if not argv:
        raise ConfigError(
            f"{origin}: no command: the image's own entrypoint is not known here; give "
            "command: and args:",
            file=file,
        )
    meta = doc.get("metadata") or {}
    own = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **(own.get("labels") or {})}
    annotations = {
        **(meta.get("annotations") or {}),
        **(own.get("annotations") or {}),
    }
    hint = annotations.get(_SERVICE_LABEL) or labels.get(_SERVICE_LABEL) or meta.get("name")
    raw = RawService(
        origin=origin,
        argv=argv,
        env=env,
        name_hint=str(hint) if hint else None,
        network_name=str(meta.get("name")) if meta.get("name") else None,
        env_origin=origin_of,
        env_refs=refs,
        workdir=container.get("workingDir"),
        health_path=_probe_path(container),
        gpus=_gpus(container),
        container_port=_port(container),
        annotations={
            str(k): str(v)
            for k, v in {**labels, **annotations}.items()
            if str(k).startswith("autotune.io/")
        },
    )
    _exported(raw, annotations)
    raw.notes += _env_from(container, origin)
    raw.notes.append(
        f"{origin}: autotune runs its command on this machine, not in the container: its "
        f"program ({argv[0]}) must exist here (edit the deployment's command if not)"
    )
    for other in containers:
        if other is not container:
            raw.notes.append(f"{where}: container {other.get('name')} (a sidecar) not imported")
    if role == "leader":
        raw.notes.append(f"{where}: the leader's container imported; its workers are not")
    if pod.get("initContainers"):
        raw.notes.append(f"{where}: init containers not imported")
    return raw


def _exported(raw: RawService, annotations: dict[str, Any]) -> None:
    """What ``autotune best --export k8s`` records beside the manifest: the GPUs the trial
    used (a pod's are numbered from 0, so the variable itself is not set there) and the start
    order its init containers keep."""
    gpus = annotations.get("autotune.io/cuda-visible-devices")
    if gpus and "CUDA_VISIBLE_DEVICES" not in raw.env:
        raw.env["CUDA_VISIBLE_DEVICES"] = str(gpus)
        raw.notes.append(
            f"{raw.origin}: CUDA_VISIBLE_DEVICES={gpus} from its autotune.io/cuda-visible-devices "
            "annotation (the GPUs it ran on)"
        )
    depends = annotations.get("autotune.io/depends-on")
    if depends:
        raw.depends_on = [d.strip() for d in str(depends).split(",") if d.strip()]


def _plain_argv(container: dict[str, Any]) -> list[str]:
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    return [str(w) for w in words]


def _env(
    container: dict[str, Any], *, origin: str, file: str
) -> tuple[dict[str, str], set[str], dict[str, str]]:
    env: dict[str, str] = {}
    refs: set[str] = set()
    origin_of: dict[str, str] = {}
    for item in container.get("env") or []:
        name = str(item.get("name"))
        if "value" in item:
            env[name] = _expand(str(item.get("value") or ""), env)
            continue
        source = item.get("valueFrom") or {}
        secret = source.get("secretKeyRef")
        if isinstance(secret, dict):
            env[name] = reference(name)
            refs.add(name)
            origin_of[name] = f"Secret {secret.get('name')} key {secret.get('key')}"
            continue
        kind = next(iter(source), "valueFrom")
        raise ConfigError(
            f"{origin}: {name} comes from {kind}, whose value the cluster holds: give it a "
            "value (env: value:) to import it",
            file=file,
            field=f"env.{name}",
        )
    return env, refs, origin_of


def _env_from(container: dict[str, Any], origin: str) -> list[str]:
    """``envFrom``: the variables are not listed in the manifest, so they cannot be written;
    a local service inherits autotune's environment, where they can be exported."""
    out = []
    for item in container.get("envFrom") or []:
        what = "Secret" if "secretRef" in item else "ConfigMap"
        ref = item.get("secretRef") or item.get("configMapRef") or {}
        out.append(
            f"{origin}: the variables of {what} {ref.get('name')} (envFrom) are not listed in "
            "the manifest: export them in the shell that runs `autotune run` (local services "
            "inherit it)"
        )
    return out


def _expand(text: str, env: dict[str, str], used: set[str] | None = None) -> str:
    """Kubernetes' ``$(VAR)`` expansion from the container's own variables."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"  # Kubernetes: "$$" is a literal "$" (so "$$(VAR)" is not expanded)
        name = match.group(1)
        if name in env and used is not None:
            used.add(name)
        return env[name] if name in env else match.group(0)

    return _KUBE_VAR.sub(sub, text)


def _probe_path(container: dict[str, Any]) -> str | None:
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        http = (container.get(probe) or {}).get("httpGet") or {}
        if http.get("path"):
            return str(http["path"])
    return None


def _gpus(container: dict[str, Any]) -> int | None:
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get("nvidia.com/gpu")
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def _port(container: dict[str, Any]) -> int | None:
    ports = [p.get("containerPort") for p in container.get("ports") or [] if isinstance(p, dict)]
    ports = [p for p in ports if isinstance(p, int)]
    return ports[0] if len(ports) == 1 else None
