#!/usr/bin/env bash
# Run the hardware check on a machine with an NVIDIA GPU, installing nothing from the network.
# Wheels for missing runtime dependencies (aiohttp, structlog, PyYAML, ...) may be carried in
# .whl/ (see docs/hardware-validation.md for how to download them).
set -euo pipefail
cd "$(dirname "$0")/../.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
PYTHONUNBUFFERED=1 python3 tests/hardware/check.py "$@"
