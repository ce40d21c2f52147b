#!/usr/bin/env bash
# The device's .whl/ (run HERE, from the repository root): ../shared/device/wheels.sh's packages plus
# what memra's tests need beyond them on the H200 image (the openai client's httpx2 / httpcore2 /
# truststore, jsonschema and its parts, llguidance, regex; fastapi's opentelemetry-api and annotated-doc). Without the extras the GPU tests that
# import them fail to collect (session 14's first run: 11 collection errors).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/device/wheels.sh httpx2 httpcore2 truststore jsonschema jsonschema-specifications referencing \
  rpds-py attrs llguidance regex opentelemetry-api annotated-doc "$@"
