"""What every command shares: the ``--study``/``--storage`` options, the consoles, the one-line
error handling, checks of output paths and the help text of the docstrings.

autotune's own modules are imported inside the functions that need them: each pulls in
pydantic, PyYAML, SQLAlchemy or Optuna (40-330 ms measured), which ``autotune --help`` must
not pay.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.text import Text

from autotune.errors import AutotuneError, ConfigError
from autotune.secrets import scrub_text

DEFAULT_STUDY = "dsv4-flash-sim"

console = Console()
err_console = Console(stderr=True)


def say(text: str | Text, *, err: bool = False) -> None:
    """One line as given, to stdout (stderr with ``err``): no markup or highlighting (it quotes
    what users wrote) and no wrapping: rich wraps at 80 columns when the output is not a
    terminal, which would break the paths and commands that scripts read from it."""
    (err_console if err else console).print(text, highlight=False, markup=False, soft_wrap=True)


F = TypeVar("F", bound=Callable[..., Any])

StudyOpt = typer.Option(
    DEFAULT_STUDY, "--study", help="Study name (also selects studies/NAME.yaml)."
)
StudyFileOpt = typer.Option(
    None, "--study-file", help="Study definition (default studies/NAME.yaml)."
)
StorageOpt = typer.Option(
    None, "--storage", help="Storage URL (default sqlite:///studies/NAME.db)."
)

_KEEP_LINES = "\b"
"""Click's marker: a paragraph that starts with it keeps its line breaks (a list, an example)."""


def help_text(doc: str | None) -> str:
    """A docstring as help text: each paragraph on one line, so the help screen wraps it to
    the terminal's width rather than where the source was wrapped. Paragraphs (blank-line
    separated) stay separate; one that starts with ``\\b`` keeps its lines."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(
        p if p.startswith(_KEEP_LINES) else re.sub(r"\s*\n\s*", " ", p.strip()) for p in paragraphs
    )


def friendly(func: F) -> F:
    """Turn AutotuneError into a one-line message and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AutotuneError as exc:
            # Text, not markup: the message quotes what the user wrote ("[/]" included).
            text = one_line(scrub_text(str(exc)))  # a driver may quote a password
            message = Text.assemble(("error:", "bold red"), " ", text)
            say(message, err=True)
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            say("interrupted", err=True)
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def one_line(text: str) -> str:
    """Control characters a user typed (a newline in ``--study``) shown escaped."""
    from autotune.yamlio import escape_controls

    return escape_controls(text)


def check_study(study: str) -> None:
    """``--study`` names files (``studies/NAME.yaml``, the run directory): checked first."""
    from autotune.study.storage import check_study_name

    check_study_name(study)


def check_out(path: Path, *, option: str, directory: bool) -> None:
    """An output path that cannot be written fails before any work, naming the option."""
    if directory and path.exists() and not path.is_dir():
        raise ConfigError(f"{str(path)!r} exists and is not a directory", field=option)
    if not directory and path.is_dir():
        raise ConfigError(f"{str(path)!r} is a directory; give a file name", field=option)
    if not directory and path.exists() and not (path.is_file() or path.is_char_device()):
        # A FIFO would block the write until someone reads it.
        raise ConfigError(f"{str(path)!r} is not a regular file", field=option)
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"{str(above)!r} is not a directory", field=option)


@contextlib.contextmanager
def writing(option: str) -> Iterator[None]:
    """OSError while writing an output -> ConfigError naming the option (disk full, ...)."""
    try:
        yield
    except OSError as exc:
        where = f" {exc.filename!r}" if exc.filename else ""
        raise ConfigError(f"cannot write{where}: {exc.strerror or exc}", field=option) from None


def shown(url: str) -> str:
    """A storage URL without its password."""
    from autotune.study.storage import display_url

    return display_url(url)


def storage_url(study: str, storage: str | None) -> str:
    """``--storage``, else the study's default SQLite file."""
    from autotune.study.storage import default_storage_url

    return storage or default_storage_url(study)


def open_existing(study: str, storage: str | None) -> Any:
    """The stored study (an Optuna study); StorageError when there is none."""
    from autotune.study.storage import load_study, open_storage

    url = storage_url(study, storage)
    return load_study(study, open_storage(url, create=False))


def study_file_path(study: str, study_file: Path | None) -> Path:
    """``--study-file``, else the study's default file ``studies/NAME.yaml``."""
    return study_file or Path("studies") / f"{study}.yaml"


def deployment_context(study: str, study_file: Path | None) -> tuple[Any, Any, Any, Path]:
    """(definition, space, deployment, run_dir) of a study file, as ``run`` resolves them."""
    from autotune.deployment import load_deployment
    from autotune.space import load_space
    from autotune.study.definition import load_study_definition

    definition = load_study_definition(study_file_path(study, study_file))
    space = load_space(definition.resolve(definition.space))
    deployment = load_deployment(definition.resolve(definition.deployment))
    return definition, space, deployment, deployment.default_run_dir(study)


def check_url(url: str) -> str:
    """A ``--url`` (bench, init) must be http(s)://HOST[:PORT][/path]: urllib and httpx raise
    raw errors (``InvalidURL``) for the rest."""
    allowed = ["http://HOST:PORT", "https://HOST:PORT"]
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # ValueError for a port that is not 0..65535
    except ValueError as exc:
        raise ConfigError(f"invalid URL {url!r}: {exc}", field="--url", allowed=allowed) from None
    bad = any(c.isspace() or ord(c) < 32 or c == "\x7f" for c in url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or bad or port == 0:
        raise ConfigError(f"not an http(s) URL: {url!r}", field="--url", allowed=allowed)
    return url.strip()
