#!/usr/bin/env python3
"""An offline wheel kit: build it where pip reaches a registry, install it on a GPU node that
reaches nothing, in parts small enough for whatever carries them.

Here (network):

    python3 scripts/h200/kit.py build vllm-0.26.0
        downloads the kit's wheels (scripts/h200/kits/vllm-0.26.0.toml) into .kit/cache/,
        deletes the members the kit strips (vLLM's FlashAttention 2 library, ...; RECORD is
        rewritten to match), packs every wheel into one tar, compresses it (``compression``:
        xz by default, the wheels' members stored uncompressed so that xz sees them: vLLM's
        0.26.0 kit goes from 184.5 to 125.7 MiB, three device calls instead of four), splits
        it into parts of ``part_mib`` and writes .kit/vllm-0.26.0/kit.json (the sha256 of
        every part, of the whole and of every wheel). Run again, it rebuilds the same bytes
        from the same wheels (downloads are cached).
    python3 scripts/h200/kit.py plan vllm-0.26.0
        the parts in order, with the ``carry`` list of each device call.

There (the GPU node; only the standard library is used, so it runs before anything else):

    python3 scripts/h200/kit.py install vllm-0.26.0 --target /tmp/site
        takes every carried part whose sha256 matches kit.json into the store
        (/var/tmp/autotune-kit: outside the working tree, so it outlives the command), says
        which parts are still missing (exit 3), and once all are there joins them, checks the
        whole's sha256, unpacks it (checking every wheel's sha256), installs the wheels with
        ``pip --no-index --no-deps --target`` and imports the kit's ``check`` modules. Run it
        after every part: parts already stored are kept, an install already done (the stamp
        in the target names the kit's sha256) returns at once. A part that arrives damaged is
        refused and must be sent again.

A user with an offline GPU node does the same with any carrier: copy .kit/NAME/ there (scp
through a bastion, a disk), then ``kit.py install NAME --from THAT_DIR --target DIR`` and put
DIR on PYTHONPATH.

Exit codes: 0 done, 3 parts missing (send the next one), 1 an error (named on stderr).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[2]
KITS = Path(__file__).with_name("kits")
BUILD_DIR = ROOT / ".kit"
STORE = Path(os.environ.get("AUTOTUNE_KIT_STORE", "/var/tmp/autotune-kit"))
MISSING = 3
CHUNK = 1 << 20
COMPRESSIONS = ("xz", "none")
"""How the payload (the tar of wheels) is compressed: ``xz`` (the default) over wheels whose
members are stored, or ``none`` (the wheels as downloaded, deflated). Measured on the vLLM
0.26.0 kit: deflate leaves FlashAttention 3's 146 MiB library at 36.6 MiB, xz at about 12;
the whole goes from 184.5 to 125.7 MiB."""
XZ_PRESET = 9 | lzma.PRESET_EXTREME
"""One preset, one thread: the same wheels give the same bytes (a node keeps its parts across
rebuilds), whatever the machine that builds."""


class KitError(Exception):
    """Bad kit input: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Spec:
    name: str
    python: str
    part_mib: int
    platforms: tuple[str, ...]
    wheels: tuple[str, ...]
    strip: dict[str, tuple[str, ...]]
    check: tuple[str, ...]
    compression: str = "xz"

    @classmethod
    def load(cls, name: str, kits: Path = KITS) -> Spec:
        path = kits / f"{name}.toml"
        if not path.exists():
            known = sorted(p.stem for p in kits.glob("*.toml"))
            raise KitError(f"no kit {name!r}: {path} does not exist (kits: {', '.join(known)})")
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise KitError(f"{path}: {exc}") from None
        allowed = {
            "name",
            "python",
            "part_mib",
            "platforms",
            "wheels",
            "strip",
            "check",
            "compression",
        }
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise KitError(f"{path}: unknown field(s) {unknown} (allowed: {sorted(allowed)})")
        for key in ("name", "python", "part_mib", "platforms", "wheels"):
            if key not in raw:
                raise KitError(f"{path}: missing field {key!r}")
        if raw["name"] != name:
            raise KitError(f"{path}: name is {raw['name']!r}, the file says {name!r}")
        part_mib = raw["part_mib"]
        if not isinstance(part_mib, int) or not 1 <= part_mib <= 60:
            raise KitError(f"{path}: part_mib must be an integer from 1 to 60, not {part_mib!r}")
        pins = [w for w in raw["wheels"] if "==" not in w]
        if pins:
            raise KitError(f"{path}: wheels must be pinned with ==, not {pins}")
        strip = {k: tuple(v) for k, v in raw.get("strip", {}).items()}
        compression = raw.get("compression", "xz")
        if compression not in COMPRESSIONS:
            raise KitError(
                f"{path}: compression must be one of {list(COMPRESSIONS)}, not {compression!r}"
            )
        return cls(
            name=name,
            python=str(raw["python"]),
            part_mib=part_mib,
            platforms=tuple(raw["platforms"]),
            wheels=tuple(raw["wheels"]),
            strip=strip,
            check=tuple(raw.get("check", ())),
            compression=compression,
        )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def say(message: str) -> None:
    print(f"[kit {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _dist_name(wheel_file: str) -> str:
    return wheel_file.split("-", 1)[0].lower().replace("_", "-")


def _requirement_name(requirement: str) -> str:
    return requirement.split("==", 1)[0].strip().lower().replace("_", "-")


# --- here: build ---------------------------------------------------------------------------


def download(spec: Spec, cache: Path) -> list[Path]:
    """The kit's wheels in ``cache`` (pip skips what is already there), one per requirement."""
    cache.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in spec.platforms for arg in ("--platform", p)]
    version = spec.python.replace(".", "")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        spec.python,
        "--implementation",
        "cp",
        "--abi",
        f"cp{version}",
        "--abi",
        "abi3",
        "--abi",
        "none",
        *platforms,
        "-d",
        str(cache),
        *spec.wheels,
    ]
    subprocess.run(cmd, check=True)
    found: dict[str, Path] = {}
    for wheel in sorted(cache.glob("*.whl")):
        found[_dist_name(wheel.name)] = wheel
    chosen = []
    for requirement in spec.wheels:
        name, version_pin = _requirement_name(requirement), requirement.split("==", 1)[1]
        match = found.get(name)
        if match is None or f"-{version_pin}-" not in match.name:
            matches = [w.name for w in cache.glob("*.whl") if _dist_name(w.name) == name]
            raise KitError(f"{requirement}: no matching wheel in {cache} ({matches or 'none'})")
        chosen.append(match)
    return chosen


def strip_wheel(
    wheel: Path, patterns: tuple[str, ...], out: Path, *, stored: bool = False
) -> tuple[int, int]:
    """Copy ``wheel`` to ``out`` without the members matching ``patterns`` (a pattern that
    names a folder takes everything under it); RECORD loses their lines. ``stored``: every
    member uncompressed (for a payload compressed as a whole). Returns (members removed,
    bytes removed uncompressed)."""

    def matching(member: str) -> list[str]:
        return [
            p
            for p in patterns
            if fnmatch.fnmatch(member, p) or member.startswith(p.rstrip("/") + "/")
        ]

    removed = removed_bytes = 0
    used: set[str] = set()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            hit = matching(info.filename)
            if hit:
                used.update(hit)
                removed += 1
                removed_bytes += info.file_size
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(
                    line for line in lines if not matching(line.split(",", 1)[0])
                ).encode()
            dst.writestr(
                info, data, compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            )
    unused = sorted(set(patterns) - used)
    if unused:
        raise KitError(f"strip patterns match nothing in {wheel.name}: {unused}")
    return removed, removed_bytes


def build(spec: Spec, out_dir: Path) -> dict:
    return pack(spec, download(spec, BUILD_DIR / "cache"), out_dir, BUILD_DIR / "staged")


def pack(spec: Spec, wheels: list[Path], out_dir: Path, staging: Path) -> dict:
    """Strip, tar, compress and split ``wheels`` into ``out_dir`` (parts and kit.json)."""
    staged = staging / spec.name
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    records: list[dict[str, Any]] = []
    stored = spec.compression != "none"
    for wheel in wheels:
        name = _dist_name(wheel.name)
        target = staged / wheel.name
        patterns = spec.strip.get(name, ())
        if patterns:
            removed, removed_bytes = strip_wheel(wheel, patterns, target, stored=stored)
            say(
                f"{wheel.name}: {wheel.stat().st_size / 1e6:.1f} -> "
                f"{target.stat().st_size / 1e6:.1f} MB{' stored' if stored else ''} "
                f"({removed} members, {removed_bytes / 1e6:.1f} MB unpacked, removed)"
            )
        elif stored:
            strip_wheel(wheel, (), target, stored=True)
        else:
            shutil.copy2(wheel, target)
        records.append(
            {"file": wheel.name, "bytes": target.stat().st_size, "sha256": sha256(target)}
        )
    unknown = sorted(set(spec.strip) - {_dist_name(w.name) for w in wheels})
    if unknown:
        raise KitError(f"kits/{spec.name}.toml: [strip] names wheels not in the kit: {unknown}")
    # One tar, members in a fixed order with fixed metadata, compressed with one preset: the
    # same wheels give the same bytes, so a rebuild keeps the parts a node already has.
    xz = spec.compression == "xz"
    payload = staging / f"{spec.name}.tar{'.xz' if xz else ''}"
    t0 = time.monotonic()
    # The tar written straight through the compressor: the payload is read and written once.
    with lzma.open(payload, "wb", preset=XZ_PRESET) if xz else open(payload, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for record in records:
                info = tar.gettarinfo(str(staged / record["file"]), arcname=record["file"])
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                info.mode = 0o644
                with open(staged / record["file"], "rb") as handle:
                    tar.addfile(info, handle)
        unpacked = raw.tell()  # the tar's length (an xz stream counts what went in)
    if xz:
        say(
            f"xz: {unpacked / 2**20:.1f} -> {payload.stat().st_size / 2**20:.1f} MiB "
            f"in {time.monotonic() - t0:.0f} s"
        )
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    part_bytes = spec.part_mib << 20
    parts = []
    with open(payload, "rb") as handle:
        index = 1
        while block := handle.read(part_bytes):
            part = out_dir / f"part-{index:02d}"
            part.write_bytes(block)
            parts.append(
                {
                    "file": part.name,
                    "bytes": len(block),
                    "sha256": hashlib.sha256(block).hexdigest(),
                }
            )
            index += 1
    kit: dict[str, Any] = {
        "name": spec.name,
        "python": spec.python,
        "check": list(spec.check),
        "payload": {
            "bytes": payload.stat().st_size,
            "sha256": sha256(payload),
            "compression": spec.compression,
            "unpacked_bytes": unpacked,
        },
        "parts": parts,
        "wheels": records,
    }
    (out_dir / "kit.json").write_text(json.dumps(kit, indent=1) + "\n")
    payload.unlink()
    say(
        f"{spec.name}: {len(records)} wheels, {kit['payload']['bytes'] / 2**20:.1f} MiB in "
        f"{len(parts)} parts of at most {spec.part_mib} MiB under {out_dir}"
    )
    return kit


def plan(name: str, out_dir: Path) -> None:
    kit = _read_kit(out_dir / "kit.json")
    rel = out_dir.relative_to(ROOT)
    for number, part in enumerate(kit["parts"], 1):
        carry = json.dumps([f"{rel}/kit.json", f"{rel}/{part['file']}"])
        print(f"call {number}: carry {carry}  ({part['bytes'] / 2**20:.1f} MiB)")
    print(f"each call runs: python3 scripts/h200/kit.py install {name} --target /tmp/site")


# --- there: install --------------------------------------------------------------------------


def _read_kit(path: Path) -> dict:
    if not path.exists():
        raise KitError(
            f"{path} does not exist: build the kit first (kit.py build NAME) and carry its kit.json"
        )
    try:
        kit = json.loads(path.read_text())
        kit["parts"], kit["payload"]["sha256"]  # noqa: B018 - the fields install relies on
    except (ValueError, KeyError, TypeError) as exc:
        raise KitError(f"{path}: not a kit description ({exc})") from None
    return kit


def receive(kit: dict, source: Path, store: Path) -> list[str]:
    """Move every carried, intact part into the store; return the names still missing."""
    store.mkdir(parents=True, exist_ok=True)
    missing = []
    for part in kit["parts"]:
        kept = store / part["file"]
        if kept.exists() and kept.stat().st_size == part["bytes"]:
            continue  # verified when it was stored
        carried = source / part["file"]
        if carried.exists():
            digest = sha256(carried)
            if digest == part["sha256"]:
                tmp = kept.with_suffix(".tmp")
                shutil.copyfile(carried, tmp)
                tmp.replace(kept)
                say(f"{part['file']}: received and checked ({part['bytes'] / 2**20:.1f} MiB)")
                continue
            say(
                f"{part['file']}: sha256 {digest[:12]} is not the kit's "
                f"{part['sha256'][:12]}: refused, send it again"
            )
        missing.append(part["file"])
    return missing


def install(name: str, source: Path, store_root: Path, target: Path, python: str) -> int:
    kit = _read_kit(source / "kit.json")
    if kit["name"] != name:
        raise KitError(f"{source / 'kit.json'} is the kit {kit['name']!r}, not {name!r}")
    stamp = target / f".kit-{name}"
    if stamp.exists() and stamp.read_text().strip() == kit["payload"]["sha256"]:
        say(f"{name} is installed in {target}")
        return _check(kit, target, python)
    store = store_root / name / kit["payload"]["sha256"][:16]
    missing = receive(kit, source, store)
    have = len(kit["parts"]) - len(missing)
    if missing:
        say(
            f"{have} of {len(kit['parts'])} parts stored in {store}; still missing: "
            f"{', '.join(missing)}"
        )
        return MISSING
    t0 = time.monotonic()
    compression = kit["payload"].get("compression", "none")  # kits before xz: plain tar
    if compression not in COMPRESSIONS:
        raise KitError(
            f"{source / 'kit.json'}: payload.compression is {compression!r} "
            f"(this kit.py reads {list(COMPRESSIONS)})"
        )
    payload = store / f"{name}.tar{'.xz' if compression == 'xz' else ''}"
    digest = hashlib.sha256()
    with open(payload, "wb") as out:
        for part in kit["parts"]:
            with open(store / part["file"], "rb") as handle:
                while block := handle.read(CHUNK):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != kit["payload"]["sha256"]:
        payload.unlink()
        raise KitError(
            f"the joined parts' sha256 is not the kit's: remove {store} and send every part again"
        )
    wheels_dir = store / "wheels"
    shutil.rmtree(wheels_dir, ignore_errors=True)
    with tarfile.open(payload, "r:xz" if compression == "xz" else "r:") as tar:
        tar.extractall(wheels_dir, filter="data")
    payload.unlink()
    wheels = sorted(str(p) for p in wheels_dir.glob("*.whl"))
    if len(wheels) != len(kit["wheels"]):
        raise KitError(f"{len(wheels)} wheels unpacked, kit.json lists {len(kit['wheels'])}")
    for record in kit["wheels"]:
        wheel = wheels_dir / record["file"]
        if not wheel.exists() or sha256(wheel) != record["sha256"]:
            raise KitError(
                f"{record['file']}: unpacked, its sha256 is not kit.json's: the kit was built "
                f"by another kit.py; build it again"
            )
    say(f"{len(wheels)} wheels unpacked and checked in {time.monotonic() - t0:.0f} s")
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(target),
            *wheels,
        ],
        check=True,
    )
    say(f"{len(wheels)} wheels installed into {target} in {time.monotonic() - t0:.0f} s")
    rc = _check(kit, target, python)
    if rc == 0:
        stamp.write_text(kit["payload"]["sha256"] + "\n")
    return rc


def _check(kit: dict, target: Path, python: str) -> int:
    if not kit.get("check"):
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    code = (
        "import importlib\n"
        f"for m in {kit['check']!r}:\n"
        "    v = getattr(importlib.import_module(m), '__version__', None)\n"
        "    print(m, v) if v and '.' not in m else None\n"
    )
    t0 = time.monotonic()
    done = subprocess.run([python, "-c", code], env=env)
    if done.returncode:
        say(f"import check failed: {', '.join(kit['check'])}")
        return 1
    say(f"imported {', '.join(kit['check'])} in {time.monotonic() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=["build", "plan", "install"])
    ap.add_argument("kit", help="a kit under scripts/h200/kits/ (e.g. vllm-0.26.0)")
    ap.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="where the carried kit.json and parts are (default .kit/KIT)",
    )
    ap.add_argument(
        "--store",
        type=Path,
        default=STORE,
        help="where parts are kept between commands (default %(default)s)",
    )
    ap.add_argument(
        "--target",
        type=Path,
        default=Path("/tmp/site"),
        help="the folder the wheels are installed into (PYTHONPATH)",
    )
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose pip installs and imports (default this one)",
    )
    args = ap.parse_args(argv)
    out_dir = args.source or BUILD_DIR / args.kit
    try:
        if args.verb == "build":
            build(Spec.load(args.kit), out_dir)
            plan(args.kit, out_dir)
            return 0
        if args.verb == "plan":
            plan(args.kit, out_dir)
            return 0
        return install(args.kit, out_dir, args.store, args.target, args.python)
    except KitError as exc:
        print(f"kit.py: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(
            f"kit.py: {' '.join(map(str, exc.cmd[:6]))} ... exited {exc.returncode}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
