#!/usr/bin/env bash
# bench/gpu_smoke.py on a lent GPU machine where this repository was copied without its .venv
# and nothing can be downloaded. Uses whatever Python there imports torch; if the wheels of
# bench/gpu_smoke_requirements.txt are missing and a folder of them is there (WHEELS=DIR,
# default ./wheels), installs them into .smoke-site (pip --target, no index); otherwise says
# which are missing and runs anyway (the checks that need them fail with the reason).
#
#   bash bench/gpu_smoke_device.sh          # JSON to $OUT/gpu_smoke.json when OUT is set
#
# Bounded: the whole check is killed past SMOKE_TIMEOUT_S (450 s); each GPU check has its own
# timeout inside bench/gpu_smoke.py. Exit status: gpu_smoke.py's (0 ok, 1 a check failed,
# 2 no GPU), 3 when no Python here imports torch, 124 when it timed out.
set -u
cd "$(dirname "$0")/.."
say() { echo "[gpu_smoke_device] $*"; }

PY=""
for candidate in "${PYTHON:-}" python3 python /usr/bin/python3 /usr/local/bin/python3 \
                 /opt/conda/bin/python; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
     && "$candidate" -c 'import torch' >/dev/null 2>&1; then
    PY="$candidate"; break
  fi
done
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L
if [ -z "$PY" ]; then
  say "no Python here imports torch (tried \$PYTHON, python3, python, /usr/bin/python3," \
      "/usr/local/bin/python3, /opt/conda/bin/python); pip cannot fetch one without a network"
  for candidate in python3 python; do command -v "$candidate" >/dev/null 2>&1 \
    && "$candidate" -c 'import sys; print(sys.executable, sys.version.split()[0])'; done
  exit 3
fi
say "python: $(command -v "$PY")"
"$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available())'
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| CUDA build", torch.version.cuda, "| GPUs", torch.cuda.device_count(),
[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'

missing() {  # the import names of the requirements this Python lacks
  "$PY" - <<'EOF'
import importlib.util
names = {"pyzmq": "zmq", "msgpack": "msgpack", "orjson": "orjson", "uvloop": "uvloop",
         "numpy": "numpy", "transformers": "transformers", "tokenizers": "tokenizers",
         "safetensors": "safetensors"}
print(" ".join(d for d, m in names.items() if importlib.util.find_spec(m) is None))
EOF
}
lacking="$(missing)"
WHEELS="${WHEELS:-wheels}"
if [ -n "$lacking" ] && [ -d "$WHEELS" ]; then
  say "missing: $lacking; installing from $WHEELS into .smoke-site (no index)"
  # Only what is missing: the folder need not hold wheels of what the node already has.
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target .smoke-site \
      $lacking \
    && export PYTHONPATH=".smoke-site${PYTHONPATH:+:$PYTHONPATH}"
  lacking="$(missing)"
fi
[ -n "$lacking" ] && say "still missing: $lacking (no wheels folder: WHEELS=DIR); running anyway"
"$PY" -c 'import importlib.util as u; print("vllm:", "installed" if u.find_spec("vllm") else "not installed")'

args=(bench/gpu_smoke.py --json)
[ -n "${OUT:-}" ] && args+=(--out "$OUT/gpu_smoke.json")
timeout --kill-after=10 "${SMOKE_TIMEOUT_S:-450}" "$PY" "${args[@]}"
rc=$?
say "exit $rc"
exit $rc
