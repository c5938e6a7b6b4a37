"""The ``hosts:`` map of a deployment: where each GPU host is and how to reach it over SSH.

Authentication is by key file or SSH agent only; there is deliberately no password field,
so no secret ever sits in a deployment file (a ``password`` key is rejected with a message
that says so). Host keys are verified against ``known_hosts``; accepting an unknown key is
an explicit per-host opt-in (``accept_new_host_key``), and a changed key is always refused
(see :mod:`autotune.remote.ssh`).
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autotune.errors import ConfigError
from autotune.yamlio import validation_error_to_config_error

SudoPolicy = Literal["auto", "always", "never"]
SUDO_POLICIES: tuple[str, ...] = ("auto", "always", "never")

#: Keys that would carry a secret; refused with an explanation rather than "unknown field".
_SECRET_KEYS = ("password", "passphrase", "sudo_password")
_NO_SECRETS = (
    "'{key}' is not supported: autotune never stores SSH secrets; authenticate with "
    "key_file (an unencrypted or agent-loaded key) or an SSH agent (SSH_AUTH_SOCK)"
)


class HostSpec(BaseModel):
    """One host: address and SSH settings. Everything but ``address`` has a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    address: str = Field(min_length=1)
    port: int = Field(default=22, ge=1, le=65535)
    #: Login user; ``None`` means the user running autotune (like ``ssh``).
    user: str | None = None
    #: Private key file (path only; the key itself is never read into settings or logs).
    key_file: str | None = None
    #: Name of another host in the same ``hosts:`` map used as a ProxyJump gateway.
    jump: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    #: Explicit opt-in: trust and save the key of a host not yet in ``known_hosts``.
    accept_new_host_key: bool = False
    connect_timeout_s: float = Field(default=10.0, gt=0)
    command_timeout_s: float = Field(default=120.0, gt=0)
    #: ``auto``: privileged commands run under ``sudo -n`` when the login user is not root;
    #: ``always``: privileged commands always run under ``sudo -n``; ``never``: never.
    sudo: SudoPolicy = "auto"
    #: Where systemd units live on this host (drop-ins go to ``UNIT.d/`` below it).
    systemd_unit_dir: str = "/etc/systemd/system"
    #: Where autotune keeps pidfiles, logs and what it must undo, one folder per deployment.
    run_dir: str = "~/.autotune/run"

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key in _SECRET_KEYS:
                if key in data:
                    raise PydanticCustomError("no_secrets", _NO_SECRETS, {"key": key, "field": key})
        return data

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        # Never an option: "-oProxyCommand=..." must not reach an ssh command line.
        if not re.fullmatch(r"[A-Za-z0-9_.:%-]+", value) or value.startswith("-"):
            raise PydanticCustomError(
                "address",
                "address {value} must be a host name or IP address",
                {"value": repr(value)},
            )
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*\$?", value):
            raise PydanticCustomError(
                "user",
                "user {value} must be a login name (letters, digits, '_', '.', '@', '-'; "
                "not starting with '-')",
                {"value": repr(value)},
            )
        return value

    @field_validator("key_file", "known_hosts", "run_dir", "systemd_unit_dir")
    @classmethod
    def _path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and (not value.strip() or re.search(r"[\x00-\x1f\x7f]", value)):
            raise PydanticCustomError(
                "path",
                "{name} must be a path without newlines or control characters",
                {"name": info.field_name},
            )
        if info.field_name == "systemd_unit_dir" and value is not None and value[0] != "/":
            raise PydanticCustomError(
                "path", "systemd_unit_dir must be an absolute path (systemd reads no other)", {}
            )
        return value

    @property
    def login_user(self) -> str:
        """The user name SSH logs in as."""
        return self.user or getpass.getuser()

    @property
    def known_hosts_path(self) -> str:
        return os.path.expanduser(self.known_hosts)

    @property
    def key_path(self) -> str | None:
        return os.path.expanduser(self.key_file) if self.key_file else None

    @property
    def endpoint(self) -> str:
        """``address:port`` as shown in messages."""
        return f"{self.address}:{self.port}"

    def needs_sudo(self, privileged: bool) -> bool:
        """Whether a command (privileged or not) must be wrapped in ``sudo -n``."""
        if not privileged or self.sudo == "never":
            return False
        return self.sudo == "always" or self.login_user != "root"


def validate_hosts(hosts: Mapping[str, HostSpec], *, file: str) -> None:
    """Check that every ``jump`` names another host of the map and that jumps do not loop."""
    names = sorted(hosts)
    for name, spec in hosts.items():
        if spec.jump is None:
            continue
        if spec.jump not in hosts or spec.jump == name:
            raise ConfigError(
                f"jump host {spec.jump!r} is not another host of this file",
                file=file,
                field=f"hosts.{name}.jump",
                allowed=[n for n in names if n != name],
            )
    for name in names:
        seen = [name]
        current = hosts[name].jump
        while current is not None:
            if current in seen:
                chain = " -> ".join([*seen, current])
                raise ConfigError(
                    f"jump hosts form a cycle: {chain}",
                    file=file,
                    field=f"hosts.{name}.jump",
                    allowed=[n for n in names if n not in seen],
                )
            seen.append(current)
            current = hosts[current].jump


def parse_hosts(data: object, *, file: str) -> dict[str, HostSpec]:
    """Validate a parsed ``hosts:`` mapping (name -> settings); errors are ConfigErrors
    naming ``file`` and the field (never the value, which might be a secret)."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"expected a mapping of host name -> settings, got {type(data).__name__}",
            file=file,
            field="hosts",
        )
    out: dict[str, HostSpec] = {}
    for name, raw in data.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ConfigError(
                f"host name {name!r} must be letters, digits, '_', '.', '-'",
                file=file,
                field="hosts",
            )
        if isinstance(raw, str):
            raw = {"address": raw}
        try:
            out[name] = HostSpec.model_validate(raw)
        except ValidationError as exc:
            raise validation_error_to_config_error(
                exc, file=file, model=HostSpec, prefix=("hosts", name)
            ) from None
    validate_hosts(out, file=file)
    return out
