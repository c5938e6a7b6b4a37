"""scripts/h200/kit.py: a wheel kit packed here, sent in parts, joined and installed there.

The kit's own wheels need the network and Python 3.12; these tests pack locally made
pure-Python wheels instead, so every step after the download runs for real: stripping (RECORD
rewritten), the split, part-by-part receipt with resumption, a damaged part refused, the join's
checksum, ``pip install --no-index --no-deps --target`` and the import check.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_kit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "scripts" / "h200" / "kit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_kit"] = module
    spec.loader.exec_module(module)
    return module


kit = _load_kit()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def make_wheel(
    folder: Path,
    dist: str,
    version: str,
    files: dict[str, bytes],
    compress_type: int = zipfile.ZIP_STORED,
) -> Path:
    """A minimal, valid py3-none-any wheel holding ``files``."""
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    )
    members[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(_record_line(n, d) for n, d in members.items()) + f"{info}/RECORD,,\n"
    members[f"{info}/RECORD"] = record.encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data, compress_type=compress_type)
    return path


def _wheels(folder: Path) -> list[Path]:
    """Two wheels: ~2.9 MiB incompressible, and 1 MiB that repeats 64 KiB (as a CUDA
    library repeats its kernels for each architecture): deflate's 32 KiB window sees no
    repeat in it, xz's dictionary does."""
    folder.mkdir(exist_ok=True)
    big = os.urandom(2 << 20)
    text = os.urandom(64 << 10) * 16
    engine = make_wheel(
        folder,
        "kitengine",
        "1.0",
        {
            "kitengine/__init__.py": b"VALUE = 42\n",
            "kitengine/payload.bin": big,
            "kitengine/configs.txt": text,
            "kitengine/unused/fa2.so": os.urandom(300_000),
            "kitengine/unused/readme.txt": b"not needed on this node\n",
        },
        zipfile.ZIP_DEFLATED,  # as a registry serves them
    )
    helper = make_wheel(
        folder,
        "kithelper",
        "2.0",
        {
            "kithelper/__init__.py": b"from kitengine import VALUE\nDOUBLE = 2 * VALUE\n",
            "kithelper/blob.bin": os.urandom(600_000),
        },
        zipfile.ZIP_DEFLATED,
    )
    return [engine, helper]


def _spec(compression: str = "xz") -> Any:
    return kit.Spec(
        name="demo",
        python="3.12",
        part_mib=1,
        platforms=(),
        wheels=("kitengine==1.0", "kithelper==2.0"),
        strip={"kitengine": ("kitengine/unused",)},
        check=("kitengine", "kithelper"),
        compression=compression,
    )


@pytest.fixture(params=["xz", "none"])
def packed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict, Path]:
    """The two wheels' kit, split into 1 MiB parts: xz over stored members (the default), or
    the wheels deflated as they came (``none``; kits built before xz read the same)."""
    out = tmp_path / "kit" / "demo"
    described = kit.pack(
        _spec(request.param), _wheels(tmp_path / "wheels"), out, tmp_path / "staging"
    )
    if request.param == "none":  # kit.json as kit.py wrote it before compression existed
        del described["payload"]["compression"], described["payload"]["unpacked_bytes"]
        (out / "kit.json").write_text(json.dumps(described, indent=1) + "\n")
    return described, out


def test_pack_strips_and_splits(packed: tuple[dict, Path]) -> None:
    described, out = packed
    count = -(-described["payload"]["bytes"] // (1 << 20))
    assert count >= 3
    assert [p["file"] for p in described["parts"]] == [f"part-0{i}" for i in range(1, count + 1)]
    assert all(p["bytes"] <= 1 << 20 for p in described["parts"])
    assert described["wheels"] and all(len(w["sha256"]) == 64 for w in described["wheels"])
    assert json.loads((out / "kit.json").read_text()) == described
    joined = b"".join((out / p["file"]).read_bytes() for p in described["parts"])
    assert hashlib.sha256(joined).hexdigest() == described["payload"]["sha256"]
    staged = next((out.parent.parent / "staging" / "demo").glob("kitengine-*.whl"))
    with zipfile.ZipFile(staged) as zf:
        names = zf.namelist()
        record = zf.read("kitengine-1.0.dist-info/RECORD").decode()
    assert "kitengine/payload.bin" in names
    assert not any("unused" in n for n in names)
    assert "unused" not in record and "kitengine/payload.bin" in record


def test_xz_over_stored_members_is_smaller_than_the_deflated_wheels_and_reproducible(
    tmp_path: Path,
) -> None:
    wheels = _wheels(tmp_path / "wheels")
    sizes, parts = {}, []
    for i, compression in enumerate(("none", "xz", "xz")):
        out = tmp_path / f"{compression}-{i}" / "demo"
        described = kit.pack(_spec(compression), wheels, out, tmp_path / f"staging-{compression}")
        sizes[compression] = described["payload"]["bytes"]
        parts.append(described["parts"])
    # the same wheels, the same bytes: a node keeps the parts it has across rebuilds
    assert parts[1] == parts[2]
    assert described["payload"]["compression"] == "xz"
    assert described["payload"]["unpacked_bytes"] > sizes["xz"]
    # the repeating member: 1 MiB deflated in the wheel, ~64 KiB in the xz of the whole
    assert sizes["xz"] < sizes["none"] - 800_000, sizes
    staged = next((tmp_path / "staging-xz" / "demo").glob("kitengine-*.whl"))
    with zipfile.ZipFile(staged) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_a_strip_pattern_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "kitengine", "1.0", {"kitengine/__init__.py": b""})
    with pytest.raises(kit.KitError, match=r"match nothing in kitengine-1.0.*\['kitengine/gone'\]"):
        kit.strip_wheel(wheel, ("kitengine/gone",), tmp_path / "out.whl")


def _send(out: Path, dest: Path, *parts: str) -> None:
    """What one device call carries: kit.json and the named parts."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy(out / "kit.json", dest)
    for part in parts:
        shutil.copy(out / part, dest)


def test_parts_arrive_over_several_calls_then_install(
    packed: tuple[dict, Path], tmp_path: Path
) -> None:
    described, out = packed
    carried, store, target = tmp_path / "carried", tmp_path / "store", tmp_path / "site"

    def install() -> int:
        return kit.install("demo", carried, store, target, sys.executable)

    parts = [p["file"] for p in described["parts"]]
    _send(out, carried, parts[1])
    assert install() == kit.MISSING
    _send(out, carried, parts[0])
    assert install() == kit.MISSING  # the second part was kept from the first call
    # A damaged part is refused, and the missing list still names it.
    _send(out, carried, *parts[2:])
    damaged = bytearray((carried / parts[2]).read_bytes())
    damaged[100] ^= 0xFF
    (carried / parts[2]).write_bytes(bytes(damaged))
    assert install() == kit.MISSING
    _send(out, carried, parts[2])
    assert install() == 0
    assert (target / ".kit-demo").read_text().strip() == described["payload"]["sha256"]
    assert (target / "kitengine" / "payload.bin").stat().st_size == 2 << 20
    assert not (target / "kitengine" / "unused").exists()
    done = subprocess.run(
        [sys.executable, "-c", "import kithelper; print(kithelper.DOUBLE)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "84", done.stderr
    # Installed: a further call (nothing carried but kit.json) returns at once.
    _send(out, carried)
    assert install() == 0


def test_cli_says_what_is_missing_and_exits_3(packed: tuple[dict, Path], tmp_path: Path) -> None:
    described, out = packed
    parts = [p["file"] for p in described["parts"]]
    carried = tmp_path / "carried"
    _send(out, carried, "part-01")
    env = {**os.environ, "AUTOTUNE_KIT_STORE": str(tmp_path / "store")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "h200" / "kit.py"),
            "install",
            "demo",
            "--from",
            str(carried),
            "--target",
            str(tmp_path / "site"),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == kit.MISSING, done.stderr
    assert f"1 of {len(parts)} parts stored" in done.stdout
    assert f"still missing: {', '.join(parts[1:])}" in done.stdout


def test_bad_kit_files_name_the_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text(
        'name = "broken"\npython = "3.12"\npart_mib = 50\nplatforms = []\nwheels = ["vllm"]\n'
    )
    with pytest.raises(kit.KitError, match=r"broken.toml: wheels must be pinned with ==.*vllm"):
        kit.Spec.load("broken", tmp_path)
    (tmp_path / "extra.toml").write_text(
        'name = "extra"\npython = "3.12"\npart_mib = 50\nplatforms = []\nwheels = []\nparts = 3\n'
    )
    with pytest.raises(kit.KitError, match=r"extra.toml: unknown field\(s\) \['parts'\]"):
        kit.Spec.load("extra", tmp_path)
    with pytest.raises(kit.KitError, match=r"no kit 'nothing'.*kits: broken, extra"):
        kit.Spec.load("nothing", tmp_path)
    (tmp_path / "zstd.toml").write_text(
        'name = "zstd"\npython = "3.12"\npart_mib = 50\nplatforms = []\nwheels = []\n'
        'compression = "zstd"\n'
    )
    with pytest.raises(
        kit.KitError, match=r"zstd.toml: compression must be one of \['xz', 'none'\], not 'zstd'"
    ):
        kit.Spec.load("zstd", tmp_path)


def test_the_shipped_kit_is_valid() -> None:
    spec = kit.Spec.load("vllm-0.26.0")
    assert "vllm==0.26.0" in spec.wheels
    assert 1 <= spec.part_mib <= 55  # a part plus the working tree stays under 64 MiB a call
    names = [kit._requirement_name(w) for w in spec.wheels]
    assert len(names) == len(set(names)), "one version of each package"


def test_a_wheel_unlike_kit_json_is_refused_after_the_join(
    packed: tuple[dict, Path], tmp_path: Path
) -> None:
    """The parts and the whole match, a wheel does not (a kit.json edited by hand or written
    by another build): nothing is installed."""
    described, out = packed
    described["wheels"][0]["sha256"] = "0" * 64
    (out / "kit.json").write_text(json.dumps(described))
    target = tmp_path / "site"
    with pytest.raises(kit.KitError, match=r"kitengine-1.0-py3-none-any.whl: unpacked, its sha256"):
        kit.install("demo", out, tmp_path / "store", target, sys.executable)
    assert not (target / "kitengine").exists()
