"""The winning trial as Kubernetes manifests: a Deployment and a Service per service.

The format, for people and for importers (``autotune init --from-k8s`` reads it back):

* One multi-document YAML, in start order (workers before the router); per autotune service
  a ``Deployment`` (``apps/v1``) and a ``Service`` (``v1``) of the same name: the service name
  as a DNS label (lower case, ``_`` -> ``-``; :func:`k8s_name`). The other services reach it
  at ``http://NAME:PORT`` (the Service), which is what URLs naming it in a command become.
* Labels ``app.kubernetes.io/name`` (the object name) and ``app.kubernetes.io/instance``
  (``autotune-STUDY``) select the pods; labels *and* annotations ``autotune.io/service``
  (the autotune service name), ``autotune.io/study`` and ``autotune.io/trial`` name what was
  exported (the annotation holds the exact value; a label only when the value is a valid
  label value). Annotations also carry ``autotune.io/depends-on`` (``prefill,decode``),
  ``autotune.io/cuda-visible-devices`` (the trial's GPUs) and, for the minimal winner,
  ``autotune.io/minimal-winner: "true"``; objects and pod templates carry the same set.
* One container per pod, named like the objects: ``command`` + ``args`` are the trial's argv
  (:mod:`autotune.export._containers` says which three rewrites make it run in a
  container), ``env`` the trial's environment as ``{name, value}`` sorted by name. A
  literal ``$(`` or ``$$`` is written ``$$(`` / ``$$$`` (Kubernetes expands ``$(VAR)``).
* Credentials are never written. Each secret variable is ``valueFrom.secretKeyRef`` to the
  key of that name in the Secret :data:`SECRET_NAME`, which the user creates (the export
  says how); a secret flag's value (``--api-key X``) is ``$(AUTOTUNE_SECRET_API_KEY)`` in
  ``args``, expanded by Kubernetes from that variable.
* ``ports``: ``http`` is the service's ``--port``, then its other ``--*-port`` listeners
  (``bootstrap``, ``prometheus``), all exposed by the Service (ClusterIP).
* GPUs: ``resources.limits`` ``nvidia.com/gpu: N`` (N = the entries of the trial's
  ``CUDA_VISIBLE_DEVICES``, which is then not set: the device plugin picks the GPUs and the
  container numbers them from 0), plus a memory-backed ``/dev/shm`` (NCCL and the engines'
  worker processes share tensors there; the container default is 64 MiB).
* Probes on the service's health URL (path and port): ``startupProbe`` every 10 s for the
  trial's readiness budget (model loading), ``readinessProbe``, and ``livenessProbe`` (on the
  engine's liveness path where it differs: the router's ``/health``, not ``/readiness``).
* Order: a service that depends on others gets an init container (its own image) that
  waits for their health URLs, as autotune starts the router only once its workers answer.
* ``strategy: Recreate`` (a new pod cannot get the GPUs the old one holds) and
  ``enableServiceLinks: false`` (no ``NAME_PORT=tcp://...`` variables added to the
  trial's environment: ``VLLM_PORT`` would break vLLM).

Validated in the tests against the official OpenAPI schemas of a fixed Kubernetes release
(``kubernetes-validate``, strict: an unknown field fails).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.errors import ConfigError
from autotune.export._containers import (
    PYTHON,
    ContainerService,
    Plan,
    dump_yaml,
    header,
    parse_images,
    plan,
)
from autotune.export.credentials import PLACEHOLDER, Ref
from autotune.results import TrialResult

SECRET_NAME = "autotune-secrets"
"""The Secret the containers' credentials come from (one key per variable)."""
GPU_RESOURCE = "nvidia.com/gpu"
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _startup_checks(service: ContainerService) -> int:
    """How many 10 s start-up probes fit the trial's readiness budget."""
    return max(3, math.ceil(service.ready_timeout_s / 10))


def _wait_argv(service: ContainerService, urls: Sequence[str]) -> list[str]:
    """A command that returns once every URL answers 2xx (checked every 5 s)."""
    if service.python:
        script = (
            "import sys, time, urllib.request as u\n"
            "for url in sys.argv[1:]:\n"
            "    while True:\n"
            "        try:\n"
            "            u.urlopen(url, timeout=5)\n"
            "            break\n"
            "        except Exception as exc:\n"
            "            print(f'waiting for {url}: {exc}', flush=True)\n"
            "            time.sleep(5)\n"
        )
        return [PYTHON, "-c", script, *urls]
    script = (
        'for u in "$@"; do until curl -fsS -o /dev/null --max-time 5 "$u"; do '
        'echo "waiting for $u"; sleep 5; done; done'
    )
    return ["sh", "-c", script, "wait", *urls]


def k8s_name(service: str) -> str:
    """An autotune service name as a DNS label (RFC 1035: what a Service name must be)."""
    name = re.sub(r"[^a-z0-9-]+", "-", service.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "s-" + name
    return name[:63].rstrip("-")


def export_k8s(
    trial: TrialResult,
    *,
    study: str | None = None,
    images: Sequence[str] = (),
    secret_name: str = SECRET_NAME,
    notes: Callable[[str], None] | None = None,
) -> str:
    """The manifests of ``trial`` as one YAML text (see the module docstring). ``images``:
    ``--image`` values (``IMAGE`` or ``SERVICE=IMAGE``); ``notes`` is told what the user must
    still do (create the Secret, give an image)."""
    names = {name: k8s_name(name) for name in trial.services}
    _check_names(names)
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", secret_name):
        raise ConfigError(f"invalid Secret name {secret_name!r}", field="secret_name")
    the_plan = plan(
        trial, hostname=names.__getitem__, images=parse_images(images, list(trial.services))
    )
    secrets = sorted({slot.var for s in the_plan.services for slot in s.secrets})
    if secrets:
        the_plan.notes.append(
            f"create the Secret {secret_name} (keys {', '.join(secrets)}) in the namespace "
            f"before applying: kubectl create secret generic {secret_name} "
            + " ".join(f"--from-literal={v}=..." for v in secrets)
            + " (autotune never writes credentials)"
        )
    for text in the_plan.notes:
        if notes is not None:
            notes(text)
    instance = _instance(study)
    docs: list[dict[str, Any]] = []
    for service in the_plan.services:
        meta = _metadata(the_plan, service, study=study, instance=instance)
        docs.append(_deployment(the_plan, service, meta, instance, secret_name))
        docs.append(_service(service, meta, instance))
    front = [s for s in the_plan.services if s.front]
    use = [
        "Apply: kubectl apply -f THIS_FILE [-n NAMESPACE]: one Deployment and one Service per",
        "service, in start order; requests go to "
        + ", ".join(f"Service {s.hostname} port {s.port}" for s in front)
        + ".",
    ]
    lines = header(the_plan, study=study, what="Kubernetes manifests", use=use)
    body = "---\n".join(dump_yaml(doc) for doc in docs)
    return "\n".join(lines) + "\n---\n" + body


def _check_names(names: Mapping[str, str]) -> None:
    seen: dict[str, str] = {}
    for service, name in names.items():
        if name in seen:
            raise ConfigError(
                f"services '{seen[name]}' and '{service}' would both be named '{name}' in "
                "Kubernetes (a DNS label: lower case, '-' for '_')",
                field="services",
            )
        seen[name] = service


def _instance(study: str | None) -> str:
    text = k8s_name(f"autotune-{study}") if study else "autotune"
    return text[:63].rstrip("-")


def _metadata(
    the_plan: Plan, service: ContainerService, *, study: str | None, instance: str
) -> dict[str, Any]:
    trial = the_plan.trial
    names: dict[str, str] = {"autotune.io/service": service.name}
    if study is not None:
        names["autotune.io/study"] = study
    names["autotune.io/trial"] = str(trial.number)
    labels = {
        "app.kubernetes.io/name": service.hostname,
        "app.kubernetes.io/instance": instance,
        **{k: v for k, v in names.items() if len(v) <= 63 and _LABEL_VALUE.fullmatch(v)},
    }
    annotations = dict(names)
    if trial.label == "minimal":
        annotations["autotune.io/minimal-winner"] = "true"
    if service.depends_on:
        annotations["autotune.io/depends-on"] = ",".join(service.depends_on)
    if service.gpu_ids:
        annotations["autotune.io/cuda-visible-devices"] = ",".join(service.gpu_ids)
    return {"name": service.hostname, "labels": labels, "annotations": annotations}


def _escape(text: str) -> str:
    """A literal word as Kubernetes' ``$(VAR)`` expansion gives it back."""
    return re.sub(r"\$(?=[($])", "$$", text)


def _words(words: Sequence[str | Ref]) -> list[str]:
    return [_escape(w.prefix) + f"$({w.var})" if isinstance(w, Ref) else _escape(w) for w in words]


def _env(service: ContainerService, secret_name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"name": k, "value": _escape(v)} for k, v in sorted(service.env.items())
    ]
    for slot in sorted(service.secrets, key=lambda s: s.var):
        ref = {"name": secret_name, "key": slot.var}
        items.append({"name": slot.var, "valueFrom": {"secretKeyRef": ref}})
    return items


def _probe(path: str, port: int, *, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _container(service: ContainerService, secret_name: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": service.hostname,
        "image": service.image or PLACEHOLDER,
        "command": _words(service.program),
    }
    if service.options:
        container["args"] = _words(service.options)
    env = _env(service, secret_name)
    if env:
        container["env"] = env
    if service.workdir:
        container["workingDir"] = service.workdir
    container["ports"] = [
        {"name": p.name, "containerPort": p.number, "protocol": "TCP"} for p in service.ports
    ]
    if service.gpu_ids:
        container["resources"] = {"limits": {GPU_RESOURCE: len(service.gpu_ids)}}
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    health, port = service.health_path, service.health_port
    container["startupProbe"] = _probe(
        health, port, period=10, timeout=5, failures=_startup_checks(service)
    )
    container["readinessProbe"] = _probe(health, port, period=10, timeout=5, failures=3)
    container["livenessProbe"] = _probe(
        service.liveness_path, port, period=30, timeout=10, failures=3
    )
    return container


def _deployment(
    the_plan: Plan,
    service: ContainerService,
    meta: dict[str, Any],
    instance: str,
    secret_name: str,
) -> dict[str, Any]:
    pod: dict[str, Any] = {"enableServiceLinks": False}
    if service.depends_on:
        by_name = {s.name: s for s in the_plan.services}
        urls = [
            f"http://{by_name[d].hostname}:{by_name[d].health_port}{by_name[d].health_path}"
            for d in service.depends_on
        ]
        pod["initContainers"] = [
            {
                "name": "wait-for-dependencies",
                "image": service.image or PLACEHOLDER,
                "command": _words(_wait_argv(service, urls)),
            }
        ]
    pod["containers"] = [_container(service, secret_name)]
    if service.gpu_ids:
        pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    selector = {"app.kubernetes.io/name": service.hostname, "app.kubernetes.io/instance": instance}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": meta["labels"], "annotations": meta["annotations"]},
                "spec": pod,
            },
        },
    }


def _service(service: ContainerService, meta: dict[str, Any], instance: str) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": service.hostname, "app.kubernetes.io/instance": instance}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": p.name, "port": p.number, "targetPort": p.name, "protocol": "TCP"}
                for p in service.ports
            ],
        },
    }


__all__ = ["GPU_RESOURCE", "SECRET_NAME", "export_k8s", "k8s_name"]
