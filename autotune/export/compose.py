"""The winning trial as a docker compose file: one compose service per autotune service.

The format, for people and for importers (``autotune init --from-compose`` reads it back):

* ``name: autotune-STUDY`` (the compose project; absent without a study name) and
  ``services:`` keyed by the autotune service names, exactly, in start order. The other
  services reach one at ``http://NAME:PORT`` on the project's network, which is what URLs
  naming it in a command become.
* ``entrypoint`` + ``command`` are the trial's argv (:mod:`autotune.export._containers` says
  which three rewrites make it run in a container): the program, then the options.
  ``entrypoint`` is always given, so an image's own (``vllm serve``) never runs first.
* ``environment``: the trial's variables (a map, sorted). Compose interpolates ``$``, so every
  literal ``$`` is written ``$$``.
* Credentials are never written: a secret variable is ``HF_TOKEN:
  ${HF_TOKEN:?...}`` and a secret flag's value ``${AUTOTUNE_SECRET_API_KEY:?...}`` in
  ``command`` (that variable is not added to the container's environment): compose takes
  them from its own environment or the ``.env`` file beside the compose file, and refuses
  to start while one is unset.
* ``image``: the engine's image (``--image`` gives another); with none known, a required
  interpolation ``${AUTOTUNE_IMAGE_NAME:?...}`` that fails until given.
* GPUs: ``deploy.resources.reservations.devices`` with ``driver: nvidia``, ``capabilities:
  [gpu]`` and ``device_ids`` the trial's ``CUDA_VISIBLE_DEVICES`` (the same GPUs; the
  variable itself is not set, since a container numbers its GPUs from 0), and ``ipc:
  host`` (shared memory for NCCL and the engines' worker processes).
* ``healthcheck`` on the health URL inside the container (``python3 -c`` for a Python
  program, else ``curl``), with the trial's readiness budget as ``start_period``;
  ``depends_on`` ``condition: service_healthy`` keeps the start order (the router after its
  workers).
* ``ports``: only the services no other depends on (the router; the server of a
  one-service deployment) publish their ``--port``, on the host address they listened on
  when it was a loopback one; the rest talk on the project's network.
* ``labels``: ``autotune.io/study``, ``autotune.io/trial``, ``autotune.io/service`` and, for
  the minimal winner, ``autotune.io/minimal-winner: "true"``.

Validated in the tests against the compose specification's JSON schema
(tests/data/compose-spec/), and by ``docker compose config`` where docker has the compose
plugin.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from autotune.export._containers import (
    ContainerService,
    Plan,
    check_argv,
    dump_yaml,
    header,
    parse_images,
    plan,
)
from autotune.export.credentials import Ref
from autotune.results import TrialResult

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def export_compose(
    trial: TrialResult,
    *,
    study: str | None = None,
    images: Sequence[str] = (),
    notes: Callable[[str], None] | None = None,
) -> str:
    """The compose file of ``trial`` as YAML text (see the module docstring). ``images``:
    ``--image`` values (``IMAGE`` or ``SERVICE=IMAGE``); ``notes`` is told what the user must
    still do (set the secrets, give an image)."""
    the_plan = plan(
        trial, hostname=lambda name: name, images=parse_images(images, list(trial.services))
    )
    secrets = sorted({slot.var for s in the_plan.services for slot in s.secrets})
    if secrets:
        the_plan.notes.append(
            f"set {', '.join(secrets)} in the environment of `docker compose` or in the .env "
            "file beside this file (owner-only) before `docker compose up`: compose refuses "
            "to start without them (autotune never writes credentials)"
        )
    for text in the_plan.notes:
        if notes is not None:
            notes(text)
    doc: dict[str, Any] = {}
    if study:
        doc["name"] = _project(study)
    doc["services"] = {s.name: _service(the_plan, s, study) for s in the_plan.services}
    front = [s for s in the_plan.services if s.front]
    use = [
        "Start: docker compose -f THIS_FILE up -d; requests go to "
        + ", ".join(f"{s.name} on port {s.port}" for s in front)
        + ".",
    ]
    lines = header(the_plan, study=study, what="a docker compose file", use=use)
    return "\n".join(lines) + "\n" + dump_yaml(doc)


def _project(study: str) -> str:
    """A compose project name: lower-case letters, digits, ``_`` and ``-``."""
    text = re.sub(r"[^a-z0-9_-]+", "-", f"autotune-{study}".lower()).strip("-_")
    return text or "autotune"


def _escape(text: str) -> str:
    return text.replace("$", "$$")


def required(var: str, why: str) -> str:
    """``${VAR:?why}``: compose's interpolation that refuses to run while VAR is unset."""
    return "${" + var + ":?" + why.replace("}", ")") + "}"


def _secret(var: str) -> str:
    return required(var, f"set {var}: a secret autotune does not store")


def _words(words: Sequence[str | Ref]) -> list[str]:
    return [_escape(w.prefix) + _secret(w.var) if isinstance(w, Ref) else _escape(w) for w in words]


def _image_var(name: str) -> str:
    return "AUTOTUNE_IMAGE_" + re.sub(r"[^A-Za-z0-9]+", "_", name).upper().strip("_")


def _service(the_plan: Plan, service: ContainerService, study: str | None) -> dict[str, Any]:
    image = (
        _escape(service.image)
        if service.image
        else required(
            _image_var(service.name),
            f"set {_image_var(service.name)} or export with --image {service.name}=IMAGE",
        )
    )
    out: dict[str, Any] = {"image": image, "entrypoint": _words(service.program)}
    if service.options:
        out["command"] = _words(service.options)
    env: dict[str, str] = {k: _escape(v) for k, v in sorted(service.env.items())}
    for slot in sorted(service.secrets, key=lambda s: s.var):
        if slot.flag is None:  # a flag's value is interpolated into `command` itself
            env[slot.var] = _secret(slot.var)
    if env:
        out["environment"] = env
    if service.workdir:
        out["working_dir"] = _escape(service.workdir)
    if service.front:
        published: dict[str, Any] = {"target": service.port, "published": str(service.port)}
        if service.listened_on in _LOOPBACK:
            published["host_ip"] = "127.0.0.1"
        published["protocol"] = "tcp"
        out["ports"] = [published]
    url = f"http://127.0.0.1:{service.health_port}{service.health_path}"
    out["healthcheck"] = {
        "test": ["CMD", *(_escape(w) for w in check_argv(service, url))],
        "interval": "10s",
        "timeout": "5s",
        "retries": 3,
        "start_period": f"{math.ceil(service.ready_timeout_s)}s",
        "start_interval": "5s",
    }
    if service.depends_on:
        out["depends_on"] = {d: {"condition": "service_healthy"} for d in service.depends_on}
    if service.gpu_ids:
        device = {"driver": "nvidia", "device_ids": service.gpu_ids, "capabilities": ["gpu"]}
        out["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
        out["ipc"] = "host"
    out["restart"] = "unless-stopped"
    labels = {"autotune.io/service": service.name}
    if study is not None:
        labels["autotune.io/study"] = study
    labels["autotune.io/trial"] = str(the_plan.trial.number)
    if the_plan.trial.label == "minimal":
        labels["autotune.io/minimal-winner"] = "true"
    out["labels"] = {k: _escape(v) for k, v in labels.items()}
    return out


__all__ = ["export_compose", "required"]
