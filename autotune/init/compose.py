"""Docker compose services as they run today (the compose specification's service fields).

Each service's ``entrypoint`` + ``command`` is its argv (a string is split like a shell
line; an image's own entrypoint is only known for the images listed in
:data:`IMAGE_ENTRYPOINTS`, anything else without ``entrypoint:`` is an error that asks for
it); ``environment`` (a map or ``KEY=VALUE`` list) over its ``env_file`` files is its
environment; ``working_dir``, ``depends_on``, the ``healthcheck`` URL's path and the GPUs of
``deploy.resources.reservations.devices`` come along. autotune runs the command on this
machine, not in a container: the published ports do not matter, the port the command listens
on does.

Interpolation (``${VAR}``, ``${VAR:-default}``, ``$VAR``, ``$$``) is compose's: a credential
(``${HF_TOKEN}``) stays a reference the deployment resolves when it runs (``${env:HF_TOKEN}``);
any other variable takes its value from this environment, then the ``.env`` file beside the
compose file, then its default, and is an error when none has it.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.init.model import RawService
from autotune.init.secrets import reference
from autotune.init.systemd import parse_env_file
from autotune.secrets import is_secret_flag, looks_secret
from autotune.yamlio import read_text, read_yaml

IMAGE_ENTRYPOINTS: dict[str, list[str]] = {
    # vLLM's OpenAI image: `docker run vllm/vllm-openai MODEL --tensor-parallel-size 8`
    # (vLLM recipes, Docker sections) runs `vllm serve` with the container's arguments.
    "vllm/vllm-openai": ["vllm", "serve"],
}
_INTERPOLATION = re.compile(
    r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)
_GPU_DRIVERS = {"nvidia", "cdi"}


def read_compose(path: Path, only: list[str] | None) -> list[RawService]:
    """The services of compose file ``path`` (``only``: these names, in this order)."""
    data = read_yaml(path)
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not services:
        raise ConfigError("no services: in the file", file=str(path), field="services")
    names = only or [n for n in services if isinstance(services[n], dict)]
    for name in names:
        if name not in services:
            raise ConfigError(
                f"no service named {name!r}",
                file=str(path),
                field="--service",
                allowed=sorted(services),
            )
    dotenv = _dotenv(path.parent / ".env")
    return [_service(path, name, services[name], dotenv) for name in names]


def _dotenv(path: Path) -> dict[str, str]:
    return parse_env_file(read_text(path), path=str(path)) if path.is_file() else {}


class _Vars:
    """Compose interpolation: this environment, then ``.env``; credentials stay references."""

    def __init__(self, file: str, field: str, dotenv: dict[str, str]) -> None:
        self.file, self.field, self.dotenv = file, field, dotenv
        self.refs: set[str] = set()

    def __call__(self, text: str, *, secret_context: bool = False) -> str:
        def sub(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name = match.group("braced") or match.group("bare")
            if looks_secret(name) or secret_context:
                self.refs.add(name)
                return reference(name)
            value = os.environ.get(name, self.dotenv.get(name))
            op, arg = match.group("op") or "", match.group("arg") or ""
            if op.endswith("-") and (value is None or (op == ":-" and value == "")):
                return arg
            if op.endswith("+"):
                return arg if value else ""
            if value is None:
                raise ConfigError(
                    f"${{{name}}} is not set in this environment nor in .env: set it (compose "
                    "would read it from there)",
                    file=self.file,
                    field=self.field,
                )
            return value

        return _INTERPOLATION.sub(sub, text)


def _words(value: Any, vars_: _Vars, *, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [vars_(w) for w in shlex.split(value)]
    if isinstance(value, list) and all(isinstance(w, (str, int, float)) for w in value):
        out: list[str] = []
        for i, word in enumerate(value):
            secret = i > 0 and is_secret_flag(str(value[i - 1]))
            out.append(vars_(str(word), secret_context=secret))
        return out
    raise ConfigError(f"{what} must be a string or a list of words", field=vars_.field)


def _service(path: Path, name: str, spec: Any, dotenv: dict[str, str]) -> RawService:
    file = str(path)
    base = f"services.{name}"
    if not isinstance(spec, dict):
        raise ConfigError("expected a mapping", file=file, field=base)
    vars_ = _Vars(file, base, dotenv)
    entrypoint = _words(spec.get("entrypoint"), vars_, what="entrypoint")
    command = _words(spec.get("command"), vars_, what="command")
    if not entrypoint:
        image = str(spec.get("image", "")).split("@", 1)[0].rsplit(":", 1)[0]
        known = IMAGE_ENTRYPOINTS.get(image.removeprefix("docker.io/"))
        if known is not None:
            entrypoint = list(known)
        elif command and command[0].startswith("-"):
            raise ConfigError(
                f"the command starts with an option, so the image {spec.get('image')!r} runs "
                "its own entrypoint first, which autotune does not know: give the whole "
                "command (entrypoint: and command:)",
                file=file,
                field=f"{base}.entrypoint",
            )
    argv = [*entrypoint, *command]
    if not argv:
        raise ConfigError("no command to run", file=file, field=f"{base}.command")
    env, origin = _environment(path, spec, vars_, base)
    for key, value in env.items():
        if key in vars_.refs and value == reference(key):
            origin.setdefault(key, f"compose's ${{{key}}}")
    raw = RawService(
        origin=f"compose service {name} ({path.name})",
        argv=argv,
        env=env,
        name_hint=name,
        network_name=name,
        env_origin=origin,
        env_refs=set(vars_.refs) & set(env),
        workdir=spec.get("working_dir"),
        health_path=_health_path(spec.get("healthcheck")),
        depends_on=_depends(spec.get("depends_on")),
    )
    _gpus(spec, raw, file=file, field=f"{base}.deploy")
    raw.notes.append(
        f"{raw.origin}: autotune runs its command on this machine, not in the container: "
        f"its program ({argv[0]}) must exist here (edit the deployment's command if not)"
    )
    labels = spec.get("labels")
    if isinstance(labels, dict):
        raw.annotations = {
            str(k): str(v) for k, v in labels.items() if str(k).startswith("autotune.io/")
        }
    return raw


def _environment(
    path: Path, spec: dict[str, Any], vars_: _Vars, base: str
) -> tuple[dict[str, str], dict[str, str]]:
    env: dict[str, str] = {}
    origin: dict[str, str] = {}
    files = spec.get("env_file") or []
    for entry in files if isinstance(files, list) else [files]:
        required = True
        if isinstance(entry, dict):
            required = bool(entry.get("required", True))
            entry = entry.get("path")
        env_path = (path.parent / str(entry)).resolve()
        if not env_path.is_file():
            if required:
                raise ConfigError(f"env_file {entry} does not exist", file=str(path), field=base)
            continue
        for key, value in parse_env_file(read_text(env_path), path=str(env_path)).items():
            env[key] = vars_(value) if not looks_secret(key) else reference(key)
            if looks_secret(key):
                vars_.refs.add(key)
            origin[key] = f"env_file {entry}"
    raw_env = spec.get("environment") or {}
    if isinstance(raw_env, list):
        pairs = [str(item).split("=", 1) for item in raw_env]
        raw_env = {p[0]: (p[1] if len(p) > 1 else None) for p in pairs}
    if not isinstance(raw_env, dict):
        raise ConfigError("environment must be a mapping or a list", field=f"{base}.environment")
    for key, value in raw_env.items():
        key = str(key)
        if value is None:  # `- KEY`: the value of this environment, as compose passes it
            if looks_secret(key):
                vars_.refs.add(key)
                env[key] = reference(key)
                continue
            if key not in os.environ:
                raise ConfigError(
                    f"{key} takes its value from the environment compose runs in, and it is not "
                    "set here",
                    file=str(path),
                    field=f"{base}.environment",
                )
            value = os.environ[key]
        env[key] = vars_(str(value))
        origin.pop(key, None)
    return env, origin


def _health_path(check: Any) -> str | None:
    """The path of an HTTP URL in a healthcheck's test (``curl -f http://localhost:8000/health``)."""
    if not isinstance(check, dict):
        return None
    test = check.get("test")
    text = " ".join(str(t) for t in test) if isinstance(test, list) else str(test or "")
    match = re.search(r"https?://[^/\s\"']+(/[^\s\"']*)", text)
    return match.group(1) if match else None


def _depends(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [str(k) for k in value]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def _gpus(spec: dict[str, Any], raw: RawService, *, file: str, field: str) -> None:
    """GPU devices: ``device_ids`` become ``CUDA_VISIBLE_DEVICES`` (unless set); a ``count``
    is remembered, and left to the services' own placement."""
    devices = (((spec.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    for device in devices if isinstance(devices, list) else []:
        if not isinstance(device, dict):
            continue
        capabilities = device.get("capabilities") or []
        if "gpu" not in capabilities and device.get("driver") not in _GPU_DRIVERS:
            continue
        ids = device.get("device_ids")
        if isinstance(ids, list) and ids:
            raw.gpus = len(ids)
            raw.env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in ids))
        elif device.get("count") == "all":
            raw.gpus = None
        elif isinstance(device.get("count"), int):
            raw.gpus = int(device["count"])
