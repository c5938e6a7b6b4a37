"""SSH overhead per trial: the restart phase over SSH vs on this machine, same configs.

Builds the test lab (two network-namespace hosts with their own sshd, needs root and
iproute2/openssh-server: `bash scripts/test-deps.sh`), then applies the same random
configurations of the bundled space to (a) the bundled local simulated deployment and
(b) the same servers with prefill and decode on the SSH hosts (process manager), router
local. Prints the mean restart time per trial and per restarted service for both and the
difference, i.e. what SSH adds to a trial. Usage:

    .venv/bin/python benchmarks/ssh_overhead.py --configs 12
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "remote")]

from sshd_hosts import build_lab, write_sim_pd_files  # noqa: E402

from autotune.deployment import load_deployment  # noqa: E402
from autotune.errors import LaunchError  # noqa: E402
from autotune.launch.factory import make_launcher  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.space import load_space  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    space = load_space(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    rng = random.Random(args.seed)
    configs = [space.random_config(rng, avoid_forbidden=True) for _ in range(args.configs)]
    with tempfile.TemporaryDirectory(prefix="autotune-ssh-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "lab").mkdir()
        lab = build_lab(tmp / "lab")
        try:
            write_sim_pd_files(
                lab,
                tmp,
                study_template=REPO / "tests" / "data" / "e2e-study.yaml",
                decode_manager="process",
            )
            ssh_file = tmp / "deployment.yaml"
            # Same simulated load time as the local deployment, so only transport differs.
            ssh_file.write_text(ssh_file.read_text().replace("'0.2'", "'0.3'"))
            deployments = {
                "local": load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd.yaml"),
                "ssh": load_deployment(ssh_file),
            }
            results: dict[str, list[tuple[float, int, str | None]]] = {}
            for name, dep in deployments.items():
                run_dir = tmp / f"run-{name}"
                launcher = make_launcher(dep, run_dir=run_dir)
                rows = []
                try:
                    for config in configs:
                        specs = render(space, dep, config, run_dir=run_dir)
                        t0 = time.monotonic()
                        try:
                            restarted = len(launcher.apply(specs).restarted)
                            failure = None
                        except LaunchError as exc:
                            restarted, failure = 1, exc.failure
                        rows.append((time.monotonic() - t0, restarted, failure))
                finally:
                    launcher.close()
                results[name] = rows
        finally:
            lab.teardown()
    both_ok = [
        i
        for i in range(len(configs))
        if results["local"][i][2] is None and results["ssh"][i][2] is None and i > 0
    ]
    print(f"configs: {len(configs)} (first apply starts everything; compared: {len(both_ok)})")
    summary = {}
    for name, rows in results.items():
        per_trial = [rows[i][0] for i in both_ok]
        per_service = [rows[i][0] / rows[i][1] for i in both_ok if rows[i][1]]
        failures = [r[2] for r in rows if r[2]]
        summary[name] = statistics.mean(per_trial)
        print(
            f"{name:5s}: restart per trial mean {statistics.mean(per_trial):.2f} s "
            f"(median {statistics.median(per_trial):.2f}), per restarted service "
            f"{statistics.mean(per_service):.2f} s; failures {failures}"
        )
    extra = summary["ssh"] - summary["local"]
    print(f"SSH adds {extra:.2f} s per trial ({summary['ssh'] / summary['local']:.2f}x local)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
