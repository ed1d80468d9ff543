#!/usr/bin/env bash
# The checks that need a GPU, in one command of about 8 minutes on one GPU (no GPU: it says so and exits 3):
#   bash benchmarks/cuda_checks.sh [OUT_DIR]         (default: outputs/cuda_checks; each check's output a file)
# 1. tests that run only on CUDA: no host sync in a training step outside logging steps (torch's sync debug
#    mode), CUDA-event phase timing against synchronized timing (tests/test_timing.py);
# 2. the CUDA claims of `python -m gan.patterns` (asynchronous timing, non_blocking copies from pinned memory);
# 3. short runs of train.py under trainer.precision=16-mixed and bf16-mixed, on the ring, DCGAN and resnet 64x64;
# 4. benchmarks/step.py on the GPU: framework/bare on the ring and DCGAN 64x64, its speed options (bf16,
#    channels_last, compile) and compiled against eager.
# A failing check is reported and the next one runs; the exit status is the number of checks that failed.
set -u
cd "$(dirname "$0")/.."
out="${1:-outputs/cuda_checks}"
mkdir -p "$out"
python -c "import torch" || { echo "torch is not installed here: activate the project's environment" >&2; exit 2; }
if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch: these checks need a GPU" >&2
    exit 3
fi
failed=0
check() {  # check NAME COMMAND...: run it, its output to OUT/NAME.txt, and say how it ended
    local name=$1 start=$SECONDS
    shift
    if "$@" > "$out/$name.txt" 2>&1; then
        echo "ok      $name ($((SECONDS - start)) s)"
    else
        echo "FAILED  $name ($((SECONDS - start)) s): see $out/$name.txt"
        failed=$((failed + 1))
    fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" >> "$out/gpu.txt"

check cuda_tests python -m pytest -q -p no:cacheprovider tests/test_timing.py -k "cuda or gpu"
check patterns python -m gan.patterns --device cuda
folder="$out/images"
python - "$folder" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from step import image_folder
image_folder(Path(sys.argv[1]))
PY
for precision in 16-mixed bf16-mixed; do
    check "ring_$precision" python train.py experiment=ring trainer.accelerator=gpu trainer.precision=$precision \
        trainer.max_steps=300 train.threads=null hydra.run.dir="$out/runs/ring_$precision"
    check "dcgan64_$precision" python train.py experiment=folder data.path="$folder" trainer.accelerator=gpu \
        trainer.precision=$precision trainer.max_steps=100 hydra.run.dir="$out/runs/dcgan64_$precision"
    check "resnet64_$precision" python train.py experiment=folder model=resnet data.path="$folder" \
        trainer.accelerator=gpu trainer.precision=$precision trainer.max_steps=100 \
        hydra.run.dir="$out/runs/resnet64_$precision"
done
check step_a python benchmarks/step.py --device cuda --only a ops --recipes ring DCGAN --rounds 3 --steps 300
check step_b python benchmarks/step.py --device cuda --only b --rounds 3 --steps 50 --compile
check step_compile python benchmarks/step.py --device cuda --only compile --recipes ring --rounds 1 --steps 200
echo "$failed check(s) failed; outputs in $out"
exit "$failed"
