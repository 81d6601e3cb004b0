#!/usr/bin/env bash
# Validation of `vramlab estimate --target=pytorch-cuda`: predicted allocated / reserved against
# the measured H100 rows (../shared/baselines/h100_results.jsonl), and, on this CPU, predicted
# saved-tensor and parameter bytes against PyTorch's own accounting (saved_tensors_hooks) on 22
# further configs. Writes benches/results/torch_estimate/validation.{csv,md}.
#   VRAMLAB=path/to/vramlab TORCH_PYTHON=python benches/torch_estimate_validation.sh [--only-h100]
# --only-h100 regenerates section 1 (no PyTorch needed) and keeps the committed section 2.
set -euo pipefail
cd "$(dirname "$0")/.."
VRAMLAB=${VRAMLAB:-target/release/vramlab}
if [ ! -x "$VRAMLAB" ]; then cargo build --release --bin vramlab; fi
PY=${TORCH_PYTHON:-$HOME/.cache/vramlab/torch-venv/bin/python}
if [ "${1:-}" = "--only-h100" ]; then PY=python3; fi
"$PY" benches/torch/estimate_validation.py --vramlab "$VRAMLAB" --out benches/results/torch_estimate "$@"
