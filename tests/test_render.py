"""render(): base command + per-service settings -> ServiceSpec (no real search space)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.cpus import available_cpus, format_cpu_list
from autotune.deployment import Deployment, load_deployment
from autotune.errors import ConfigError
from autotune.render import apply_flags, render
from autotune.space.settings import ServiceSettings

Config = Mapping[str, object]


class FakeSpace:
    """The two things render needs from a SearchSpace."""

    def __init__(self, rules: dict[str, Callable[[Config], ServiceSettings]]) -> None:
        self.rules = rules
        self.calls: list[str] = []

    @property
    def services(self) -> list[str]:
        return list(self.rules)

    def settings_for(self, service: str, config: Config) -> ServiceSettings:
        self.calls.append(service)
        return self.rules[service](config)


def worker_settings(config: Config) -> ServiceSettings:
    s = ServiceSettings()
    if config.get("checkpoint") == "nvfp4":
        s.flags["--model-path"] = "/models/DeepSeek-V4-Flash-NVFP4"
        s.flags["--quantization"] = "modelopt_fp4"
    else:
        s.flags["--model-path"] = "/models/DeepSeek-V4-Flash"
        s.flags["--quantization"] = "mxfp4"
    s.flags["--mem-fraction-static"] = str(config.get("mem", 0.88))
    if not config.get("custom_all_reduce", True):
        s.flags["--disable-custom-all-reduce"] = None
    if config.get("nccl_proto", "unset") == "unset":
        s.unset_env.add("NCCL_PROTO")
    else:
        s.env["NCCL_PROTO"] = str(config["nccl_proto"])
    return s


SPACE = FakeSpace({"prefill": worker_settings, "decode": worker_settings})

DEP = """
name: t
endpoint: http://${router.host}:${router.port}
model: m/M
services:
  prefill:
    wrapper: [numactl, --cpunodebind=0, --membind=0]
    command: ["${python}", -m, srv, --model-path, /models/DeepSeek-V4-Flash, --tp-size, "4",
              --mem-fraction-static=0.80, --disable-radix-cache, --host, "${host}",
              --port, "${port}", --trust-remote-code]
    env: {NCCL_PROTO: LL, CUDA_VISIBLE_DEVICES: "0,1,2,3"}
    port: 31000
    log_file: "${run_dir}/${service}.log"
  decode:
    command: ["${python}", -m, srv, --served-model-name, "${model}", --port, "${port}"]
    port: auto
    health: {url: "http://${host}:${port}/health_generate", timeout_s: 42}
    info_url: "http://${host}:${port}/server_info"
  router:
    command: [rt, --prefill, "http://${prefill.host}:${prefill.port}", "8998",
              --prefill, "http://127.0.0.2:1", "8999", --decode,
              "http://${decode.host}:${decode.port}", --log-dir, "${run_dir}/${deployment}"]
    port: 31002
    depends_on: [prefill, decode]
"""


@pytest.fixture
def dep(tmp_path: Path) -> Deployment:
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(DEP))
    return load_deployment(path)


def test_replace_in_place_and_append(dep: Deployment, tmp_path: Path) -> None:
    specs = render(SPACE, dep, {"checkpoint": "nvfp4", "mem": 0.9}, run_dir=tmp_path)
    argv = list(specs["prefill"].argv)
    assert argv[:3] == ["numactl", "--cpunodebind=0", "--membind=0"]  # wrapper untouched
    assert argv[3:6] == [sys.executable, "-m", "srv"]
    # --model-path replaced where it was; --flag=value form kept; new flag appended
    assert argv[6:8] == ["--model-path", "/models/DeepSeek-V4-Flash-NVFP4"]
    assert argv[10] == "--mem-fraction-static=0.9"
    assert argv[-2:] == ["--quantization", "modelopt_fp4"]
    assert argv.count("--model-path") == 1


def test_switches_added_and_removed() -> None:
    base = [
        "p",
        "--a",
        "1",
        "--disable-radix-cache",
        "--speculative-algorithm",
        "EAGLE",
        "--b=2",
        "--trust-remote-code",
    ]
    settings = ServiceSettings(
        flags={"--disable-cuda-graph": None, "--b": None},
        remove_flags={"--disable-radix-cache", "--speculative-algorithm", "--not-there"},
    )
    out = apply_flags(base, settings, service="decode")
    assert out == ["p", "--a", "1", "--b", "--trust-remote-code", "--disable-cuda-graph"]


def test_no_flag_emitted_twice_but_untouched_repeats_kept(dep: Deployment, tmp_path: Path) -> None:
    out = apply_flags(
        ["p", "--tp-size", "4", "--x", "--tp-size=8"],
        ServiceSettings(flags={"--tp-size": "2"}),
        service="s",
    )
    assert out == ["p", "--tp-size", "2", "--x"]
    router = render(SPACE, dep, {}, run_dir=tmp_path)["router"].argv
    assert router.count("--prefill") == 2  # a multi-worker router line is left alone


@settings(deadline=None, max_examples=200)
@given(
    base=st.lists(st.sampled_from(["--a", "--b", "--c=1", "--d", "v", "--e=x"]), max_size=12),
    flags=st.dictionaries(
        st.sampled_from(["--a", "--b", "--c", "--f"]),
        st.one_of(st.none(), st.sampled_from(["1", "2"])),
    ),
    remove=st.sets(st.sampled_from(["--d", "--e", "--g"])),
)
def test_property_each_set_flag_exactly_once(
    base: list[str], flags: dict[str, str | tuple[str, ...] | None], remove: set[str]
) -> None:
    out = apply_flags(
        ["prog", *base], ServiceSettings(flags=flags, remove_flags=remove), service="s"
    )
    names = [t.split("=", 1)[0] for t in out if t.startswith("--")]
    for flag, value in flags.items():
        assert names.count(flag) == 1
        i = next(i for i, t in enumerate(out) if t.split("=", 1)[0] == flag)
        given_value = (
            out[i].split("=", 1)[1]
            if "=" in out[i]
            else (out[i + 1] if i + 1 < len(out) and not out[i + 1].startswith("--") else None)
        )
        assert given_value == value
    assert not set(names) & remove
    assert out[0] == "prog"


def test_env_merge_and_unset(dep: Deployment, tmp_path: Path) -> None:
    unset = render(SPACE, dep, {"nccl_proto": "unset"}, run_dir=tmp_path)["prefill"]
    assert "NCCL_PROTO" not in unset.env and unset.unset_env == ("NCCL_PROTO",)
    assert unset.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert unset.command_line().startswith("env -u NCCL_PROTO CUDA_VISIBLE_DEVICES=0,1,2,3 ")
    simple = render(SPACE, dep, {"nccl_proto": "Simple"}, run_dir=tmp_path)["prefill"]
    assert simple.env["NCCL_PROTO"] == "Simple" and simple.unset_env == ()


def test_templates_and_paths(dep: Deployment, tmp_path: Path) -> None:
    specs = render(SPACE, dep, {}, run_dir=tmp_path / "run")
    ports = dep.ports()
    pre, dec, rt = specs["prefill"], specs["decode"], specs["router"]
    assert pre.port == 31000 and pre.argv[pre.argv.index("--port") + 1] == "31000"
    assert pre.argv[pre.argv.index("--host") + 1] == "127.0.0.1"
    assert pre.health_url == "http://127.0.0.1:31000/health"
    assert pre.log_file == str(tmp_path / "run" / "prefill.log")
    assert dec.argv[dec.argv.index("--served-model-name") + 1] == "m/M"
    assert dec.health_url == f"http://127.0.0.1:{ports['decode']}/health_generate"
    assert dec.ready_timeout_s == 42 and dec.info_url and dec.info_url.endswith("/server_info")
    assert dec.log_file == str(tmp_path / "run" / "decode.log")  # default log_file
    assert f"http://127.0.0.1:{ports['decode']}" in rt.argv
    assert "http://127.0.0.1:31000" in rt.argv
    assert str(tmp_path / "run" / "t") in rt.argv  # ${run_dir}/${deployment}
    assert rt.depends_on == ("prefill", "decode")
    assert not any("${" in a for s in specs.values() for a in s.argv)


def test_fingerprints_stable_and_local(dep: Deployment, tmp_path: Path) -> None:
    cfg = {"checkpoint": "mxfp4", "mem": 0.85, "custom_all_reduce": False}
    a = render(SPACE, dep, cfg, run_dir=tmp_path)
    b = render(SPACE, dep, dict(reversed(list(cfg.items()))), run_dir=tmp_path)
    assert {n: s.fingerprint() for n, s in a.items()} == {n: s.fingerprint() for n, s in b.items()}
    assert a == b
    c = render(SPACE, dep, {**cfg, "mem": 0.86}, run_dir=tmp_path)
    assert c["prefill"].fingerprint() != a["prefill"].fingerprint()
    assert c["router"].fingerprint() == a["router"].fingerprint()
    assert "--disable-custom-all-reduce" in a["decode"].argv


def test_only_targeted_services_asked(dep: Deployment, tmp_path: Path) -> None:
    space = FakeSpace({"prefill": worker_settings, "decode": worker_settings})
    render(space, dep, {}, run_dir=tmp_path)
    assert space.calls == ["prefill", "decode"]
    bare = render(None, dep, {}, run_dir=tmp_path)
    assert "--quantization" not in bare["prefill"].argv


def test_space_errors(dep: Deployment, tmp_path: Path) -> None:
    bad = FakeSpace({"worker": worker_settings})
    with pytest.raises(ConfigError) as info:
        render(bad, dep, {}, run_dir=tmp_path)
    assert info.value.allowed == ["prefill", "decode", "router"]
    clash = FakeSpace(
        {"decode": lambda c: ServiceSettings(flags={"--x": "1"}, remove_flags={"--x"})}
    )
    with pytest.raises(ConfigError, match="both sets and removes --x"):
        render(clash, dep, {}, run_dir=tmp_path)
    abbrev = FakeSpace({"decode": lambda c: ServiceSettings(flags={"-x": "1"})})
    with pytest.raises(ConfigError, match="invalid flag name"):
        render(abbrev, dep, {}, run_dir=tmp_path)


def test_bundled_sim_deployment_renders_like_the_brief(tmp_path: Path) -> None:
    dep = load_deployment("sim-dsv4-flash-pd")
    specs = render(SPACE, dep, {"checkpoint": "mxfp4"}, run_dir=tmp_path)
    p1, p2 = dep.ports()["prefill"], dep.ports()["decode"]
    assert specs["prefill"].argv[:3] == (sys.executable, "-m", "autotune.sim.server")
    assert specs["decode"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    router = specs["router"].argv
    bootstrap = dep.extra_ports()["prefill"]["bootstrap"]
    assert router[1:3] == ("-m", "sglang_router.launch_router")  # the real SGLang router
    assert router[3:13] == (
        "--pd-disaggregation",
        "--prefill",
        f"http://127.0.0.1:{p1}",
        str(bootstrap),
        "--decode",
        f"http://127.0.0.1:{p2}",
        "--host",
        "127.0.0.1",
        "--port",
        str(dep.ports()["router"]),
    )
    prefill = specs["prefill"].argv
    assert prefill[prefill.index("--disaggregation-bootstrap-port") + 1] == str(bootstrap)
    prometheus = router[router.index("--prometheus-port") + 1]
    assert prometheus == str(dep.extra_ports()["router"]["prometheus"])
    assert dep.endpoint_url(run_dir=tmp_path) == f"http://127.0.0.1:{dep.ports()['router']}"


def test_sim_speedup_reaches_the_simulated_servers() -> None:
    from pathlib import Path

    from autotune.deployment import load_deployment
    from autotune.render import render

    dep = load_deployment(
        Path(__file__).resolve().parents[1] / "launchers" / "sim-dsv4-flash-pd.yaml"
    )
    assert dep.sim_speedup == 8
    specs = render(None, dep, {}, run_dir=Path("/tmp/x"))
    assert specs["decode"].env["AUTOTUNE_SIM_SPEEDUP"] == "8"
    assert specs["prefill"].env["AUTOTUNE_SIM_SPEEDUP"] == "8"


def _with_client_cpus(tmp_path: Path, cpus: str, *, base: str = DEP) -> Path:
    path = tmp_path / "pinned.yaml"
    body = textwrap.dedent(base).replace("model: m/M\n", f"model: m/M\nclient_cpus: '{cpus}'\n")
    path.write_text(body)
    return path


@pytest.mark.skipif(len(available_cpus()) < 2, reason="needs two CPUs")
def test_client_cpus_start_local_services_on_the_other_cpus(
    dep: Deployment, tmp_path: Path
) -> None:
    mine = available_cpus()
    client = min(mine)
    pinned = load_deployment(_with_client_cpus(tmp_path, str(client)))
    assert pinned.client_cpu_set() == {client}
    specs = render(SPACE, pinned, {}, run_dir=tmp_path)
    rest = format_cpu_list(mine - {client})
    for name in ("decode", "router"):
        assert specs[name].argv[:3] == ("taskset", "-c", rest), name
    # before any wrapper of its own (numactl), never inside the engine's flags
    assert specs["prefill"].argv[:4] == ("taskset", "-c", rest, "numactl")
    plain = render(SPACE, dep, {}, run_dir=tmp_path)
    assert specs["prefill"].argv[3:] == plain["prefill"].argv  # a fixed port: same flags
    assert specs["prefill"].fingerprint() != plain["prefill"].fingerprint()  # a restart


@pytest.mark.skipif(len(available_cpus()) < 2, reason="needs two CPUs")
def test_a_service_placed_by_its_own_taskset_is_left_alone(tmp_path: Path) -> None:
    own = DEP.replace("wrapper: [numactl,", "wrapper: [/usr/bin/taskset, -c, '0', numactl,")
    path = _with_client_cpus(tmp_path, str(min(available_cpus())), base=own)
    specs = render(SPACE, load_deployment(path), {}, run_dir=tmp_path)
    assert specs["prefill"].argv[:4] == ("/usr/bin/taskset", "-c", "0", "numactl")
    assert specs["decode"].argv[0] == "taskset"


@pytest.mark.parametrize(
    ("cpus", "why"),
    [("0-100000", "not a range"), ("x", "not a CPU"), ("", "empty")],
)
def test_a_bad_client_cpu_list_names_the_file_and_field(
    tmp_path: Path, cpus: str, why: str
) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        load_deployment(_with_client_cpus(tmp_path, cpus))
    assert info.value.field == "client_cpus" and "pinned.yaml" in str(info.value)


def test_client_cpus_must_leave_the_services_a_cpu_and_be_the_tuners(tmp_path: Path) -> None:
    mine = available_cpus()
    dep = load_deployment(_with_client_cpus(tmp_path, format_cpu_list(mine)))
    with pytest.raises(ConfigError, match="leaves no CPU for the services") as info:
        render(SPACE, dep, {}, run_dir=tmp_path)
    assert info.value.field == "client_cpus"
    outside = max(mine) + 1
    dep = load_deployment(_with_client_cpus(tmp_path, str(outside)))
    with pytest.raises(ConfigError, match="may not run on") as info:
        render(SPACE, dep, {}, run_dir=tmp_path)
    assert info.value.allowed == [format_cpu_list(mine)]


VLLM_DEP = """
name: v
endpoint: http://${worker.host}:${worker.port}
model: m/M
services:
  worker:
    command: [vllm, serve, /models/m, --port, "${port}"]
    port: auto
  pinned:
    command: [vllm, serve, /models/m, --port, "${port}"]
    env: {VLLM_RPC_BASE_PATH: /srv/rpc}
    port: auto
  other:
    command: ["${python}", -m, srv, --port, "${port}"]
    port: auto
"""


def test_an_engine_that_leaves_files_gets_a_scratch_directory(tmp_path: Path) -> None:
    """vLLM's sockets (VLLM_RPC_BASE_PATH) go to a directory the manager removes; a
    deployment that set the variable keeps its value; other programs get none, and where
    the files go is not a restart (the fingerprint)."""
    path = tmp_path / "v.yaml"
    path.write_text(textwrap.dedent(VLLM_DEP))
    specs = render(FakeSpace({}), load_deployment(path), {}, run_dir=tmp_path)
    assert specs["worker"].scratch_env == ("VLLM_RPC_BASE_PATH",)
    assert "VLLM_RPC_BASE_PATH" not in specs["worker"].env
    assert specs["pinned"].scratch_env == () and specs["other"].scratch_env == ()
    bare = specs["worker"].model_copy(update={"scratch_env": ()})
    assert bare.fingerprint() == specs["worker"].fingerprint()
