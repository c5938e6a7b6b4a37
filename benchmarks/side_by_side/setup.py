"""What every arm shares: the study (its space, deployment and load), the rendered baseline,
the `vllm` CLI prefix and the ``vllm bench serve`` command with the study's load."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.deployment import Deployment, load_deployment
from autotune.loadgen import LoadSpec
from autotune.loadgen.datasets import RandomDataset
from autotune.render import render
from autotune.space import SearchSpace, load_space
from autotune.specs import ServiceSpec
from autotune.study.definition import StudyDefinition, load_study_definition

from . import REPO
from .processes import Processes
from .vllm_lengths import VllmLoad, special_tokens_added, vllm_load

STUDY_FILE = REPO / "studies" / "vllm-cpu.yaml"
VLLM_PYTHON = REPO / ".venv-engines" / "vllm-0.32.0" / "bin" / "python"
SERVICE = "server"

VLLM_CLI_SHIM = (
    "import importlib.metadata as m, sys\n"
    "_version = m.version\n"
    "m.version = lambda name: _version('vllm-cpu' if name == 'vllm' else name)\n"
    "sys.argv[0] = 'vllm'\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)
"""The `vllm` CLI, unchanged, except that the version it asks importlib.metadata for is the
vllm-cpu dist's: its main() calls importlib.metadata.version("vllm") to build its parser, so
both the console script and `python -m vllm.entrypoints.cli.main` fail there with
PackageNotFoundError (that environment's dist is vllm-cpu)."""
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
"""Run with ``-m``: the module ends with ``if __name__ == "__main__": main()`` (0.26.0 and
0.32.0), and where the dist is named vllm that is the `vllm` console script without one."""
CLI_KINDS = ("shim", "module")


def vllm_cli(python: str | Path, kind: str = "shim") -> list[str]:
    """argv prefix that runs `vllm ...` with ``python``: ``shim`` for the vllm-cpu dist,
    ``module`` for a dist named vllm."""
    if kind == "shim":
        return [str(python), "-c", VLLM_CLI_SHIM]
    if kind == "module":
        return [str(python), "-m", VLLM_CLI_MODULE]
    raise ValueError(f"--vllm-cli is one of {', '.join(CLI_KINDS)}, not {kind!r}")


def changed(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sorted(config.items()) if baseline.get(k) != v}


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def rel(path: Path) -> str:
    """``path`` from the project root when it lies under it (for the tables)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


class Setup:
    """The study, its space and deployment, the load, and the rendered baseline."""

    def __init__(
        self,
        study_file: Path,
        out: Path,
        seed: int,
        cli: Sequence[str] | None = None,
    ) -> None:
        self.study_file = study_file.resolve()
        self.out = out
        self.seed = seed
        self.cli = list(cli) if cli is not None else vllm_cli(VLLM_PYTHON)
        self.study: StudyDefinition = load_study_definition(self.study_file)
        self.space_file = self.study.resolve(self.study.space)
        self.deployment_file = self.study.resolve(self.study.deployment)
        self.space: SearchSpace = load_space(self.space_file)
        self.baseline = dict(self.space.baseline_config())
        self.load = self.study.load
        assert self.load.requests is not None and self.load.warmup_requests is not None

    def deployment(self) -> Deployment:
        """A fresh deployment: its ``port: auto`` is picked anew (free now)."""
        return load_deployment(self.deployment_file)

    def specs(
        self, config: Mapping[str, Any], run_dir: Path
    ) -> tuple[Deployment, ServiceSpec, dict[str, ServiceSpec], str]:
        dep = self.deployment()
        specs = render(self.space, dep, dict(config), run_dir=run_dir)
        return dep, specs[SERVICE], specs, dep.endpoint_url(specs, run_dir=run_dir)

    def load_spec(self, seed: int, model: str | None) -> LoadSpec:
        """The study's load (as the tuning loop measures it), prompts from ``seed``."""
        given = {k: getattr(self.load, k) for k in self.load.given}
        return LoadSpec.model_validate({**given, "model": model, "seed": seed})

    def vllm_lengths(self, model_dir: str) -> VllmLoad:
        """The study's random dataset as ``vllm bench serve``'s random-dataset options."""
        dataset = self.load.requests_dataset
        if not isinstance(dataset, RandomDataset):
            raise SystemExit(
                f"{self.study_file}: vllm bench serve is given the study's load only for a "
                f"random dataset, not {dataset.kind}"
            )
        return vllm_load(
            dataset.input_len,
            dataset.output_len,
            dataset.range_ratio,
            special=special_tokens_added(model_dir),
        )

    def vllm_bench(self, url: str, spec: ServiceSpec, model: str, seed: int) -> list[str]:
        """``vllm bench serve`` with the study's load (no result options)."""
        argv = list(spec.argv)
        model_dir = argv[argv.index("--model") + 1]
        load = self.load
        return [
            *self.cli,
            "bench",
            "serve",
            "--backend",
            "openai",
            "--base-url",
            url,
            "--endpoint",
            "/v1/completions",
            "--model",
            model_dir,
            "--served-model-name",
            model,
            "--dataset-name",
            "random",
            *self.vllm_lengths(model_dir).argv(),
            "--max-concurrency",
            str(load.concurrency),
            "--num-prompts",
            str(load.requests),
            "--num-warmups",
            str(load.warmup_requests),
            "--ignore-eos",
            "--seed",
            str(seed),
            "--disable-tqdm",
        ]

    def bench_env(self, run_dir: Path) -> dict[str, str]:
        """Environment of `vllm bench ...` (offline, no usage stats, temp files in run_dir)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(run_dir),
        }


def run_vllm_bench(
    procs: Processes, cmd: Sequence[str], result: Path, env: Mapping[str, str], log: Path
) -> dict[str, Any]:
    """One `vllm bench serve`; its saved result (output_throughput, duration, ...)."""
    full = [
        *cmd,
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]
    rc = procs.run(full, log=log, env=env, echo=bench_line)
    if rc != 0 or not result.is_file():
        raise RuntimeError(f"vllm bench serve failed (exit {rc}); see {log}")
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def bench_line(line: str) -> bool:
    return line.startswith(("Output token throughput", "Benchmark duration", "Successful"))
