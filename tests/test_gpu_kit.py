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


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
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
            zf.writestr(name, data, compress_type=zipfile.ZIP_STORED)
    return path


@pytest.fixture()
def packed(tmp_path: Path) -> tuple[dict, Path]:
    """A kit of two wheels (~2.6 MiB, incompressible, stored) split into 1 MiB parts."""
    wheels_dir = tmp_path / "wheels"
    wheels_dir.mkdir()
    big = os.urandom(2 << 20)
    engine = make_wheel(
        wheels_dir,
        "kitengine",
        "1.0",
        {
            "kitengine/__init__.py": b"VALUE = 42\n",
            "kitengine/payload.bin": big,
            "kitengine/unused/fa2.so": os.urandom(300_000),
            "kitengine/unused/readme.txt": b"not needed on this node\n",
        },
    )
    helper = make_wheel(
        wheels_dir,
        "kithelper",
        "2.0",
        {
            "kithelper/__init__.py": b"from kitengine import VALUE\nDOUBLE = 2 * VALUE\n",
            "kithelper/blob.bin": os.urandom(600_000),
        },
    )
    spec = kit.Spec(
        name="demo",
        python="3.12",
        part_mib=1,
        platforms=(),
        wheels=("kitengine==1.0", "kithelper==2.0"),
        strip={"kitengine": ("kitengine/unused",)},
        check=("kitengine", "kithelper"),
    )
    out = tmp_path / "kit" / "demo"
    described = kit.pack(spec, [engine, helper], out, tmp_path / "staging")
    return described, out


def test_pack_strips_and_splits(packed: tuple[dict, Path]) -> None:
    described, out = packed
    assert [p["file"] for p in described["parts"]] == ["part-01", "part-02", "part-03"]
    assert all(p["bytes"] <= 1 << 20 for p in described["parts"])
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

    _send(out, carried, "part-02")
    assert install() == kit.MISSING
    _send(out, carried, "part-01")
    assert install() == kit.MISSING  # part-02 was kept from the first call
    # A damaged part is refused, and the missing list still names it.
    _send(out, carried, "part-03")
    damaged = bytearray((carried / "part-03").read_bytes())
    damaged[100] ^= 0xFF
    (carried / "part-03").write_bytes(bytes(damaged))
    assert install() == kit.MISSING
    _send(out, carried, "part-03")
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
    _, out = packed
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
    assert "1 of 3 parts stored" in done.stdout and "still missing: part-02, part-03" in done.stdout


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


def test_the_shipped_kit_is_valid() -> None:
    spec = kit.Spec.load("vllm-0.26.0")
    assert "vllm==0.26.0" in spec.wheels
    assert 1 <= spec.part_mib <= 55  # a part plus the working tree stays under 64 MiB a call
    names = [kit._requirement_name(w) for w in spec.wheels]
    assert len(names) == len(set(names)), "one version of each package"
