#!/usr/bin/env bash
# HERE, after ../shared/device/wheels.sh: add to .whl/ the wheels the device's GPU tests import that its image and
# that script lack — the `test` extra's jsonschema with its dependencies, and what the current `openai` client
# imports (httpx2, httpcore2, ...). Without them, session 51's `pytest -m gpu` collected 12 of its files with
# ModuleNotFoundError (httpx2, jsonschema): the serve / structured / forced GPU tests never ran. And fastapi with its
# dependencies (0.165 imports opentelemetry-api: session 55's serve runs stopped at ModuleNotFoundError).
#   bash ../shared/device/wheels.sh && bash experiments/device_wheels.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -f .whl/setup.sh ] || { echo "run ../shared/device/wheels.sh first (.whl/setup.sh missing)"; exit 1; }
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 -d .whl "$(python3 -c 'import openai; print("openai==" + openai.__version__)' \
  2>/dev/null || echo openai)" "jsonschema>=4.17" \
  "$(python3 -c 'import fastapi; print("fastapi==" + fastapi.__version__)' 2>/dev/null || echo fastapi)"
ls .whl | wc -l
