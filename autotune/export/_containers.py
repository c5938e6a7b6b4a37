"""What the container exports (compose, Kubernetes) share: a trial's services as containers.

A stored service is an argv, an environment and where it answered (its health URL). In a
container it runs **the trial's command line word for word**, with three rewrites and no
other change, each needed for the container to work at all:

1. **The interpreter**: an absolute path to a Python interpreter in the program part
   (``/srv/venv/bin/python -m vllm.entrypoints.openai.api_server``: the deployment's
   ``${python}``, a path on the tuning machine) becomes ``python3``, the image's own.
2. **The listen address**: the value of ``--host`` and ``--prometheus-host`` (:data:`LISTEN_FLAGS`),
   when it is a loopback address or the service's own host, becomes ``0.0.0.0``: a
   container is reached on its own network interface (by a Kubernetes Service, a probe,
   another compose service), never on its loopback.
3. **The other services' addresses**: a URL ``scheme://HOST:PORT`` in a word of the command
   or a value of the environment, where HOST:PORT is where another service of the trial
   answered (the host of its health URL, one of its ports), names that service's hostname
   instead, with the same port: ``--prefill http://127.0.0.1:30000`` becomes ``--prefill
   http://prefill:30000`` (a compose service name, a Kubernetes Service name).

Ports are the trial's. GPUs: ``CUDA_VISIBLE_DEVICES=4,5,6,7`` becomes the container's GPU
reservation (compose ``device_ids``, Kubernetes ``nvidia.com/gpu: 4``) and is not set
itself: inside a container the GPUs it was given are numbered from 0, and ``4,5,6,7`` would
name devices it does not have. A service without the variable reserves no GPU (autotune does
not know what it used); an empty value (no GPU) is kept as it is.

The argv is written in two parts, compose ``entrypoint`` + ``command`` and Kubernetes
``command`` + ``args``: the program (wrapper, interpreter, ``-m module``) and the options
from the first ``--flag`` on. Joined, they are the argv. Credentials are never written:
:mod:`autotune.export.credentials` splits them out, and each exporter references them its
own way.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from autotune.engines import ENGINES, SGLangEngine, engine_for_command
from autotune.errors import ConfigError
from autotune.export.credentials import Ref, Slot, redact_trial, split_service
from autotune.export.topology import dependencies, start_order
from autotune.results import ServiceRecord, TrialResult

LISTEN_FLAGS = ("--host", "--prometheus-host")
"""Flags whose value is an address the service listens on (SGLang, vLLM, the router)."""
LISTEN_ALL = "0.0.0.0"
PYTHON = "python3"
"""The interpreter of every engine image (vllm/vllm-openai, lmsysorg/sglang)."""
DEFAULT_HEALTH_PATH = "/health"
DEFAULT_READY_TIMEOUT_S = 600.0
SIMULATED_PROGRAM = "autotune.sim.server"

IMAGE_TEMPLATES: dict[str, str] = {
    # Docker Hub tags are the release with a "v" (v0.26.0); the image runs `vllm serve` as
    # its entrypoint, which the exported command replaces.
    "vllm": "vllm/vllm-openai:v{version}",
    # lmsysorg/sglang:vX.Y.Z also holds the router (docker/Dockerfile builds sgl-router).
    "sglang": "lmsysorg/sglang:v{version}",
    "sglang-router": "lmsysorg/sglang:v{version}",
}
"""Default image per engine, at the release the trial's server reported (its
``engine_version``), else autotune's pinned release of that engine. The simulated servers,
``transformers serve`` and generic engines have none: ``--image SERVICE=IMAGE`` gives one."""
LIVENESS_PATHS: dict[str, str] = {
    # sglang-router: /readiness is 503 until its workers are registered (the readiness
    # gate), /health is 200 while the process runs; restarting the router because a
    # worker restarts would not help it.
    "sglang-router": "/health",
}
"""Liveness path per engine when it is not the readiness (health) path."""

_LOCAL = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"}
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?")
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<host>\[[^\]/]+\]|[^/:\s@]+):(?P<port>\d+)"
)
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")
_VERSION = re.compile(r"\d+(\.\d+)+(\.post\d+|rc\d+)?")
_IANA = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Port:
    """A port the container listens on: ``http`` (its ``--port``) first, then the others."""

    name: str
    """An IANA service name (at most 15 of ``a-z0-9-``), as Kubernetes port names must be."""
    number: int


@dataclass
class ContainerService:
    """One service of the trial, as its container runs it."""

    name: str
    """The autotune service name."""
    hostname: str
    """How the others reach it: the compose service name, the Kubernetes Service name."""
    program: list[str | Ref]
    options: list[str | Ref]
    env: dict[str, str]
    """Public variables (rewritten URLs, no ``CUDA_VISIBLE_DEVICES`` when GPUs are reserved)."""
    secrets: list[Slot]
    unset_env: list[str]
    ports: list[Port]
    listened_on: str
    """The host the trial's service answered on (its health URL's host)."""
    health_path: str
    health_port: int
    liveness_path: str
    gpu_ids: list[str]
    """The trial's ``CUDA_VISIBLE_DEVICES`` entries: the GPUs to reserve (empty: none)."""
    image: str | None
    """``None``: no default for its engine and none given (the exporter writes a placeholder)."""
    image_why: str
    engine: str
    depends_on: list[str]
    ready_timeout_s: float
    workdir: str | None
    python: bool
    """Its program is Python: checks use ``python3 -c`` (else ``curl``)."""
    front: bool = False
    """No other service depends on it: where requests come in (published by compose)."""

    @property
    def port(self) -> int:
        return self.ports[0].number


@dataclass
class Plan:
    """The trial's services in start order, and what the user must still do."""

    trial: TrialResult
    services: list[ContainerService]
    notes: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    """Absolute paths the commands and environments name (models, caches): not in an image
    unless baked in or mounted."""


def parse_images(values: Sequence[str], services: Collection[str]) -> dict[str | None, str]:
    """``--image IMAGE`` (every service) and ``--image SERVICE=IMAGE``: ``{service or None:
    image}``. A ConfigError names the option, the bad value and the services there are."""
    out: dict[str | None, str] = {}
    for value in values:
        name: str | None
        name, eq, image = value.partition("=")
        if not eq:
            name, image = None, value
        elif name not in services:
            raise ConfigError(
                f"--image {value!r}: the trial has no service {name!r}",
                field="--image",
                allowed=sorted(services),
            )
        if not _IMAGE.fullmatch(image):
            raise ConfigError(
                f"--image {value!r}: {image!r} is not an image reference (e.g. "
                "vllm/vllm-openai:v0.26.0, registry.example.com/team/server:1.2)",
                field="--image",
            )
        if name in out:
            what = f"service {name!r}" if name else "every service"
            raise ConfigError(f"--image given twice for {what}", field="--image")
        out[name] = image
    return out


def plan(
    trial: TrialResult,
    *,
    hostname: Callable[[str], str],
    images: Mapping[str | None, str] | None = None,
) -> Plan:
    """The services of ``trial`` as containers (see the module docstring), in start order.
    ``hostname`` names a service on the containers' network."""
    trial = redact_trial(trial)
    if not trial.services:
        raise ConfigError(f"trial {trial.number} has no services to export", field="services")
    images = dict(images or {})
    deps = dependencies(trial.services)
    order = start_order(trial.services)
    needed = {d for needs in deps.values() for d in needs}
    where = {name: _where(name, rec) for name, rec in trial.services.items()}
    addresses: dict[tuple[str, int], str] = {}
    for name, (host, ports, _) in where.items():
        for port in ports:
            addresses[(_norm(host), port.number)] = name
    out = Plan(trial=trial, services=[])
    for name in order:
        rec = trial.services[name]
        host, ports, health = where[name]
        others = {k: hostname(v) for k, v in addresses.items() if v != name}
        service = _container(trial, name, rec, host, ports, health, others, images, out)
        service.hostname = hostname(name)
        service.depends_on = list(deps[name])
        service.front = name not in needed
        out.services.append(service)
    return out


def _where(name: str, rec: ServiceRecord) -> tuple[str, list[Port], tuple[str, int | None]]:
    """(host it answered on, its ports, (health path, health port)) from its record."""
    health_host, health_port, health_path = None, None, DEFAULT_HEALTH_PATH
    if rec.health_url:
        parts = urlsplit(rec.health_url)
        health_host = parts.hostname
        health_path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with contextlib.suppress(ValueError):  # a port out of range: as if none
            health_port = parts.port
    main = _flag_port(rec.argv, "--port") or health_port
    if main is None:
        raise ConfigError(
            f"service '{name}': neither a --port in its command nor a port in its health URL: "
            "which port it listens on is not known",
            field=f"services.{name}.argv",
        )
    ports = [Port("http", main)]
    for flag, number in _extra_ports(rec.argv):
        if all(p.number != number for p in ports):
            ports.append(Port(_port_name(flag, {p.name for p in ports}), number))
    if health_port is not None and all(p.number != health_port for p in ports):
        ports.append(Port(_port_name("--health-port", {p.name for p in ports}), health_port))
    return health_host or "127.0.0.1", ports, (health_path, health_port or main)


def _flag_port(argv: Sequence[str], flag: str) -> int | None:
    for i, word in enumerate(argv):
        value = None
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
        if value is not None and value.isdigit() and 1 <= int(value) <= 65535:
            return int(value)
    return None


def _extra_ports(argv: Sequence[str]) -> list[tuple[str, int]]:
    """``(--X-port, number)`` of every other port flag with a numeric value, in argv order."""
    out: list[tuple[str, int]] = []
    for word in argv:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag != "--port" and flag.endswith(("-port", "_port")):
            number = _flag_port(argv, flag)
            if number is not None and (flag, number) not in out:
                out.append((flag, number))
    return out


def _port_name(flag: str, taken: set[str]) -> str:
    """``--disaggregation-bootstrap-port`` -> ``bootstrap``; unique, an IANA service name."""
    words = [w for w in re.split(r"[-_]+", flag.lstrip("-").lower()) if w][:-1] or ["port"]
    base = _IANA.sub("", words[-1])[:15] or "port"
    if not re.search("[a-z]", base):
        base = ("p" + base)[:15]
    name, n = base, 2
    while name in taken:
        suffix = f"-{n}"
        name, n = base[: 15 - len(suffix)] + suffix, n + 1
    return name


def _norm(host: str) -> str:
    return "local" if host in _LOCAL else host.lower()


def _container(
    trial: TrialResult,
    name: str,
    rec: ServiceRecord,
    host: str,
    ports: list[Port],
    health: tuple[str, int | None],
    others: Mapping[tuple[str, int], str],
    images: Mapping[str | None, str],
    out: Plan,
) -> ContainerService:
    split = split_service(rec)
    if isinstance(split.argv[0] if split.argv else None, Ref) or not split.argv:
        raise ConfigError(f"service '{name}' has no program to run", field=f"services.{name}.argv")
    cut = _options_start(rec.argv)
    words: list[str | Ref] = []
    interpreter_done = False
    for i, word in enumerate(split.argv):
        if isinstance(word, Ref):
            words.append(word)
            continue
        if i < cut and not interpreter_done and _is_interpreter(word):
            word, interpreter_done = PYTHON, True
        elif i > 0 and split.argv[i - 1] in LISTEN_FLAGS and _own(word, host):
            word = LISTEN_ALL
        elif "=" in word and word.split("=", 1)[0] in LISTEN_FLAGS:
            flag, value = word.split("=", 1)
            word = f"{flag}={LISTEN_ALL}" if _own(value, host) else word
        words.append(_rewrite_urls(word, others))
    env = {k: _rewrite_urls(v, others) for k, v in split.env.items()}
    gpu_ids = _gpu_ids(env.get("CUDA_VISIBLE_DEVICES"))
    if gpu_ids:
        del env["CUDA_VISIBLE_DEVICES"]
    engine = _engine_name(rec.argv)
    image, why = _image(trial, name, engine, images)
    if image is None:
        out.notes.append(
            f"service '{name}': no default image for {why}: give one with --image "
            f"{name}=IMAGE (an image holding its program)"
        )
    elif engine == "vllm" and not gpu_ids:
        out.notes.append(
            f"service '{name}': {image} is vLLM's CUDA build and the service reserves no GPU "
            "(no CUDA_VISIBLE_DEVICES): for vLLM's CPU build give its image with --image"
        )
    texts = [*(w for w in words[cut:] if isinstance(w, str)), *env.values(), rec.workdir or ""]
    for value in texts:
        for path in re.findall(r"(?:^|=)(/[^\s:=,]+)", value):
            if path not in out.paths and not path.startswith(("/dev/", "/proc/")):
                out.paths.append(path)
    health_path, health_port = health
    if not rec.health_url:
        out.notes.append(
            f"service '{name}': the study stored no health URL (an older study): probes "
            f"use {health_path} on port {ports[0].number}"
        )
    program = words[:cut]
    python = any(
        isinstance(w, str) and _PYTHON_NAME.fullmatch(w.rsplit("/", 1)[-1]) for w in program
    )
    return ContainerService(
        name=name,
        hostname=name,
        program=program,
        options=words[cut:],
        env=env,
        secrets=list(split.slots),
        unset_env=sorted(rec.unset_env),
        ports=ports,
        listened_on=host,
        health_path=health_path,
        health_port=health_port or ports[0].number,
        liveness_path=LIVENESS_PATHS.get(engine, health_path),
        gpu_ids=gpu_ids,
        image=image,
        image_why=why,
        engine=engine,
        depends_on=[],
        ready_timeout_s=rec.ready_timeout_s or DEFAULT_READY_TIMEOUT_S,
        workdir=rec.workdir,
        python=python,
    )


def _options_start(argv: Sequence[str]) -> int:
    """Where the options begin: the engine's own rule, else the first ``--flag`` after the
    program (after ``-m module`` when there is one)."""
    engine = engine_for_command(argv)
    if engine is not None:
        start = engine.options_start(argv)
    else:
        after = argv.index("-m") + 2 if "-m" in argv else 1
        start = next((i for i in range(after, len(argv)) if argv[i].startswith("--")), len(argv))
    return max(1, min(start, len(argv)))


def _is_interpreter(word: str) -> bool:
    return word.startswith("/") and bool(_PYTHON_NAME.fullmatch(word.rsplit("/", 1)[-1]))


def _own(value: str, host: str) -> bool:
    return value in _LOCAL or value == host


def _rewrite_urls(text: str, others: Mapping[tuple[str, int], str]) -> str:
    def sub(match: re.Match[str]) -> str:
        host = match.group("host").strip("[]")
        target = others.get((_norm(host), int(match.group("port"))))
        if target is None:
            return match.group(0)
        return f"{match.group('scheme')}://{target}:{match.group('port')}"

    return _URL.sub(sub, text)


def _gpu_ids(value: str | None) -> list[str]:
    if value is None:
        return []
    ids = [v.strip() for v in value.split(",") if v.strip()]
    return [] if not ids or any(v.startswith("-") for v in ids) else ids


def _engine_name(argv: Sequence[str]) -> str:
    if any(w == SIMULATED_PROGRAM for w in argv):
        return "simulated"
    engine = engine_for_command(argv)
    return engine.name if engine is not None else "generic"


def _image(
    trial: TrialResult, name: str, engine: str, images: Mapping[str | None, str]
) -> tuple[str | None, str]:
    """The service's image and why that one."""
    if name in images:
        return images[name], "given with --image"
    if None in images:
        return images[None], "given with --image"
    template = IMAGE_TEMPLATES.get(engine)
    if template is None:
        what = {"simulated": "autotune's simulated server"}.get(engine, f"the {engine} engine")
        return None, what
    version, origin = _version(trial, name, engine)
    return template.format(version=version), f"the default for {engine}, {origin}"


def _version(trial: TrialResult, name: str, engine: str) -> tuple[str, str]:
    """The release for the image tag: the one the server reported, else autotune's pinned one."""
    if engine == "sglang-router":
        # The router ships in SGLang's image: the trial's SGLang workers' release.
        reported = [
            v
            for n, v in trial.engine_version.items()
            if n in trial.services and _engine_name(trial.services[n].argv) == "sglang"
        ]
        engine = "sglang"
    else:
        reported = [trial.engine_version.get(name, "")]
    for value in reported:
        match = _VERSION.match(value or "")
        if match:
            return match.group(0), f"the release its server reported ({match.group(0)})"
    pinned = ENGINES[engine].default_version or SGLangEngine.default_version or "latest"
    return pinned, f"autotune's pinned {engine} release {pinned}: the trial reported none"


def check_argv(service: ContainerService, url: str) -> list[str]:
    """A command that exits 0 when ``url`` answers 2xx: with the image's ``python3`` when the
    service is a Python program (engine images have no guaranteed curl), else ``curl``."""
    if service.python:
        return [
            PYTHON,
            "-c",
            "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=5)",
            url,
        ]
    return ["curl", "-fsS", "-o", "/dev/null", "--max-time", "5", url]


def header(plan_: Plan, *, study: str | None, what: str, use: Sequence[str]) -> list[str]:
    """The comment lines every container export starts with."""
    trial = plan_.trial
    thr = f"{trial.throughput:.1f} tok/s" if trial.throughput is not None else "n/a"
    lines = [
        f"Generated by autotune: {trial.title}"
        + (f" of study '{study}'" if study else "")
        + f" as {what} (output throughput {thr}).",
        f"Deployment: {trial.deployment or 'unknown'}. Re-export rather than edit.",
        *use,
        "Commands are the trial's, word for word, except: the tuner's Python interpreter is",
        f"'{PYTHON}', listen addresses ({', '.join(LISTEN_FLAGS)}) are {LISTEN_ALL}, and URLs of",
        "the other services name them by service name; CUDA_VISIBLE_DEVICES became the GPU",
        "reservation (inside a container its GPUs are numbered from 0).",
    ]
    for s in plan_.services:
        lines.append(f"service {s.name}: image {s.image or 'NOT SET'} ({s.image_why})")
        if s.unset_env:
            lines.append(
                f"service {s.name}: the trial unset {', '.join(s.unset_env)}: make sure the "
                "image does not set them"
            )
    if plan_.paths:
        lines.append(
            "paths the services read (bake them into the image or mount them): "
            + ", ".join(plan_.paths)
        )
    lines += [f"note: {n}" for n in plan_.notes]
    return [f"# {line}".rstrip() for line in lines]


class _Dumper(yaml.SafeDumper):
    """Block style, no anchors or aliases, multi-line strings as ``|`` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value and not value.endswith((" ", "\t")) and "\r" not in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096,
        allow_unicode=True,
    )  # fmt: skip
