#!/usr/bin/env bash
# Download, here, the wheels the offline H200 machine lacks, into .whl/ (git-ignored; the device
# call carries it). The machine's image (Python 3.12.3, /opt/torch/.venv) already has torch 2.11,
# transformers 5.17, numpy, typer, rich, httpx, aiohttp, pyyaml, tqdm, narwhals, markupsafe,
# packaging, uvloop, h11, anyio, click (../.library/device/KINDS.md); it lacks:
#  * transformers serve's server stack: fastapi 0.115.12 with starlette 0.46.2 (newer fastapi
#    imports opentelemetry), uvicorn, openai 1.109.1 (2.x/3.x want httpx2), pydantic 2.11 (the
#    line fastapi 0.115 was released against) and their small dependencies;
#  * autotune's own: optuna, SQLAlchemy, alembic, Mako, colorlog, plotly (the HTML report).
# One version of each package: `pip install --no-deps .whl/*.whl` installs every file here.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=.whl
mkdir -p "$DEST"

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)
WHEELS=(
  # transformers serve
  fastapi==0.115.12 starlette==0.46.2 uvicorn==0.34.3 openai==1.109.1
  pydantic==2.11.10 pydantic-core==2.33.2 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
  annotated-types==0.8.0 typing-inspection==0.4.5
  # autotune (the versions its test suite runs with)
  optuna==5.0.0 SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 colorlog==6.12.0 plotly==7.1.0
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" \
  -d "$DEST" "${WHEELS[@]}"
ls -1 "$DEST"
du -sh "$DEST"
