#!/usr/bin/env bash
# The GPU proof, end to end, in one command on a CUDA machine (about 5-8 minutes on one H100):
#
#   bash bench/gpu_check.sh [OUT_DIR]          # default OUT_DIR: ./gpu-check-<date>
#   bash bench/gpu_check.sh --smoke [OUT_DIR]  # no GPU needed: every code path at toy sizes on CPU
#
# 1. DALI "mixed" (nvJPEG) vs CPU decoding with the recipe's augmentation, img/s       (bench/gpu_check.py)
# 2. ResNet-50 bf16 + channels_last: DALI-fed vs synthetic on-GPU batches, img/s        (bench/gpu_check.py)
#    goal: DALI-fed >= 0.95 x synthetic and >= 3,000 img/s on one H100
# 3. a failed step redone on the GPU (the step's undo: buffers, CPU and CUDA generators) equals the fixed
#    run, bit for bit; the control arm, undone without the CUDA generators, differs  (bench/gpu_check.py)
# 4. the trainer on CUDA with NCCL: `etj-train local` with one node (a world of 1) trains to step 20, then a
#    second run with the same node-local copy restarts from it and trains on to step 30 (restore, not 0).
#    One GPU cannot host two NCCL ranks (NCCL refuses two ranks on one device), so the multi-rank paths --
#    leave, join, crash recovery under cpu:gloo,cuda:nccl -- are proven on CPU (tests/trainer/
#    test_gpu_placement.py) and need a machine with 2+ GPUs to run on NCCL itself.
# 5. the sharded check (issue 41): an FSDP2 step of examples/sharded-lm's model (3.3 M parameters) on CUDA
#    with NCCL -- 2 ranks on 2+ GPUs, a world of 1 on one GPU (the NCCL limit above) -- then a DCP save and
#    a load into a zeroed model that must give back the same parameters and AdamW state, bit for bit
#                                                                                 (bench/sharded_memory.py)
#
# Needs: the etj trainer environment (pip install '.[trainer]', or the trainer image), python on PATH (or
# PYTHON=...). Prints one JSON summary on stdout (progress goes to stderr) and writes it to
# OUT_DIR/summary.json, beside OUT_DIR/gpu_check.json and the trainer's logs; exits non-zero when a check
# fails (the goal of step 2 is reported, not enforced).
set -euo pipefail

SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then
  SMOKE=1
  shift
fi
OUT=${1:-"gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say() { printf '\n== %s\n' "$*" >&2; }

say "environment"
"$PY" - <<'EOF' | tee "$OUT/env.json" >&2
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.is_available()}
if torch.cuda.is_available():
    info["device"] = torch.cuda.get_device_name(0)
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
try:
    import nvidia.dali as dali
    info["dali"] = dali.__version__
except ImportError as e:
    info["dali"] = f"missing: {e}"
print(json.dumps(info))
EOF
if [[ $SMOKE == 0 ]]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.csv" >&2
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: run with --smoke")'
fi

say "1+2+3: decode and training throughput, the redo of a failed step"
# deterministic cuBLAS for the redo check (CUDA reads it when its first handle is made)
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
if [[ $SMOKE == 1 ]]; then
  "$PY" "$HERE/gpu_check.py" --smoke --work-dir "$OUT/data" --out "$OUT/gpu_check.json" >&2
else
  "$PY" "$HERE/gpu_check.py" --work-dir "$OUT/data" --out "$OUT/gpu_check.json" >&2
fi

say "4: the trainer on CUDA + NCCL, a world of 1, then a restart from the node-local copy"
# Fresh directories: the restart must find exactly the copy the first run left.
LOCAL_CKPT="$OUT/local-copy"
rm -rf "$LOCAL_CKPT" "$OUT/trainer-1" "$OUT/trainer-2"
"$PY" -m etj_trainer.cli make-digits "$OUT/digits" --image-size 64 >/dev/null
if [[ $SMOKE == 1 ]]; then
  sizes=(--model etj_trainer.classifier.models:resnet_tiny_w8 --precision fp32 --image-size 32 --global-batch-size 32
         --micro-batch-size 16)
else
  sizes=(--model resnet18 --precision bf16 --image-size 64 --global-batch-size 128 --micro-batch-size 64)
fi
common=(--nodes 1 --data "$OUT/digits/train.tar" --val-data "$OUT/digits/val.tar" "${sizes[@]}" --epochs 100
        --augment standard --checkpoint-interval-steps 0)
run_trainer() {  # $1: run number, $2: max steps
  ETJ_LOCAL_CHECKPOINT_DIR="$LOCAL_CKPT" NCCL_DEBUG=INFO \
    "$PY" -m etj_trainer.cli local "${common[@]}" --max-steps "$2" --log-dir "$OUT/trainer-$1" \
    > "$OUT/trainer-$1.json" 2> "$OUT/trainer-$1.stderr"
}
run_trainer 1 20
run_trainer 2 30
say "5: sharded (FSDP2 + DCP): a step, a checkpoint written and loaded back"
if [[ $SMOKE == 1 ]]; then
  "$PY" "$HERE/sharded_memory.py" --gpu-check --smoke --out "$OUT/sharded.json" >&2
else
  "$PY" "$HERE/sharded_memory.py" --gpu-check --out "$OUT/sharded.json" >&2
fi
"$PY" - "$OUT" "$SMOKE" <<'EOF'
import json, pathlib, re, sys
out, smoke = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
runs = []
for n in (1, 2):
    result = json.loads((out / f"trainer-{n}.json").read_text())
    logs = "".join(p.read_text(errors="replace") for p in (out / f"trainer-{n}").glob("worker-*.log"))
    ready = re.search(r"etj: rank 0 of (\d+) ready at step (\d+) .*?\((.*?)\)", logs)
    nccl = "NCCL INFO" in logs
    runs.append({"finished": result.get("finished"), "step": result.get("step"), "worldSize": result.get("worldSize"),
                 "accuracy": result.get("accuracy"), "ready": ready.group(0) if ready else None, "nccl": nccl})
checks = {
    "run 1 finished at step 20": runs[0]["finished"] is True and runs[0]["step"] == 20,
    "run 2 restored step 20 from the local copy": bool(runs[1]["ready"] and " ready at step 20 " in runs[1]["ready"]
                                                       and "from rank 0" in runs[1]["ready"]),
    "run 2 finished at step 30": runs[1]["finished"] is True and runs[1]["step"] == 30,
    "world of 1": runs[0]["worldSize"] == 1 and runs[1]["worldSize"] == 1,
}
gpu = json.loads((out / "gpu_check.json").read_text())
checks["a redone step equals the fixed run"] = bool(gpu["redo"]["equal"])
sharded = json.loads((out / "sharded.json").read_text())["gpu_check"]
checks["sharded: an FSDP step, its DCP checkpoint loads back equal"] = sharded["equal"] is True
if not smoke:
    checks["sharded: on CUDA with NCCL"] = sharded["backend"] == "nccl" and sharded["device"] != "cpu"
if not smoke:
    checks["NCCL process group"] = runs[0]["nccl"] and runs[1]["nccl"]
    checks["the redo check is sharp (without the CUDA generators it differs)"] = (
        gpu["redo"]["control_without_cuda_rng_max_abs_diff"] > 0)
summary = {"smoke": smoke, "device": gpu.get("device"), "decode": gpu.get("decode"), "train": gpu.get("train"),
           "redo": gpu.get("redo"), "trainer_runs": runs, "sharded": sharded, "checks": checks}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
failed = [k for k, ok in checks.items() if not ok]
sys.exit(f"failed: {failed}" if failed else 0)
EOF
say "done: $OUT/summary.json"
