#!/usr/bin/env bash
# bash recipes/zoo/build.sh
# Rebuilds the whole default model family from the Python standard library and ships it into
# zoo/ with its manifest. Every step resumes if the script is killed and started again.
# On 2 CPU cores: about 40 min for the target, then about 25 min for two drafters at a time.
set -euo pipefail
cd "$(dirname "$0")/../.."
run() { echo "+ $*"; "$@"; }

run python train/pretrain.py --config recipes/zoo/target.yaml
# two lanes of one-thread jobs use both cores better than one two-thread job at a time
export OMP_NUM_THREADS=1
( python train/draft.py --config recipes/draft/distill.yaml > runs/draft.log 2>&1
  python train/eagle.py --config recipes/eagle/eagle2.yaml > runs/eagle2.log 2>&1 ) &
( python train/medusa.py --config recipes/medusa/medusa1.yaml > runs/medusa1.log 2>&1
  python train/medusa.py --config recipes/medusa/medusa2.yaml > runs/medusa2.log 2>&1 ) &
wait
unset OMP_NUM_THREADS
run python train/eagle.py --config recipes/eagle/eagle3.yaml

ship() { run python train/ship.py --name "$1" --source "$2" --recipe "$3" --command "python train/$4 --config $3"; }
ship tokenizer zoo/tokenizer recipes/zoo/target.yaml pretrain.py
ship target runs/target/final recipes/zoo/target.yaml pretrain.py
ship draft runs/draft/final recipes/draft/distill.yaml draft.py
ship medusa runs/medusa1/final recipes/medusa/medusa1.yaml medusa.py
ship medusa2 runs/medusa2/final recipes/medusa/medusa2.yaml medusa.py
ship eagle runs/eagle2/final recipes/eagle/eagle2.yaml eagle.py
ship eagle3 runs/eagle3/final recipes/eagle/eagle3.yaml eagle.py
