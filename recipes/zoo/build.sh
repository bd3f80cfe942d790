#!/usr/bin/env bash
# bash recipes/zoo/build.sh
# Rebuilds the whole default model family (target, then every drafter trained on that target) and ships it
# (EAGLE-3, P-EAGLE and DFlash fuse the target's layers 2, L//2 and L-3: their recipes say `auto`, read from the
# target's config when each stage loads it)
# into zoo/ with its manifest. Resumable: a stage whose final model exists (<OUT>/<stage>/final/
# train_report.json, written last) is skipped, and a killed stage resumes from its last checkpoint when the
# script is started again. Each stage logs to <OUT>/<stage>.log.
#   OUT=runs            where the runs go (any path; every path is quoted)
#   CORPUS=python       override every recipe's corpus (python: the stdlib + draftkit's dependencies)
#   DRY_RUN=1           print the commands (and which stages are done) without running anything
# On 2 CPU cores: about 45 min for the target, about 40 min for two lanes of drafters, 8 min for EAGLE-3, then
# P-EAGLE (from the EAGLE-3 draft) and DFlash side by side.
#
# bash recipes/zoo/build.sh --gpu   (OUT defaults to runs/gpu)
# The same stages on one GPU with far more data and steps, meant to finish in about 12 minutes on an H200-class
# GPU: the target trains on about 2.7 epochs of the `python` corpus (98M tokens, bf16), then 16,384 rows of its own
# text are regenerated and its hidden states stored once, then every drafter trains on them for thousands of steps.
# Needs torch (CUDA), transformers, accelerate, peft and safetensors only (no datasets, no wandb: --wandb false).
# The stages run one after another on the one GPU; ship them as below once their reports look right.
set -euo pipefail
cd "$(dirname "$0")/../.."
GPU=0
if [[ ${1:-} == --gpu ]]; then GPU=1; OUT=${OUT:-runs/gpu}; fi
OUT=${OUT:-runs}
TARGET=$OUT/target/final
mkdir -p "$OUT"

declare -A SCRIPT RECIPE
declare -A FLAGS  # each stage's own flags, as one shell-quoted string (printf %q), so paths may hold spaces
def() { SCRIPT[$1]=$2; RECIPE[$1]=$3; FLAGS[$1]=""; (( $# < 4 )) || FLAGS[$1]=$(printf '%q ' "${@:4}"); }
def target  pretrain.py recipes/zoo/target.yaml
def draft   draft.py    recipes/draft/distill.yaml  --target "$TARGET"
def medusa1 medusa.py   recipes/medusa/medusa1.yaml --target "$TARGET"
def medusa2 medusa.py   recipes/medusa/medusa2.yaml --target "$TARGET" --init_heads "$OUT/medusa1/final"
def eagle2  eagle.py    recipes/eagle/eagle2_reference.yaml   --target "$TARGET"
def eagle3  eagle.py    recipes/eagle/eagle3_reference.yaml   --target "$TARGET"
def peagle  eagle.py    recipes/eagle/peagle.yaml             --target "$TARGET" --init_from "$OUT/eagle3/final"
def dflash  dflash.py   recipes/dflash/dflash.yaml            --target "$TARGET"

# --gpu: larger batches and runs, bf16; the drafters' data path regenerates 16,384 rows (16 shards of 1,024)
GPU_COMMON=(--wandb false --mixed_precision bf16 --checkpoint_every 1000)
GPU_DATA="--train_rows 16384 --shard_rows 1024 --batch_size 64 --eval_every 1000"
declare -A GPU_FLAGS=(
  [target]="--batch_size 64 --max_steps 6000 --lr 0.002 --warmup_steps 300 --eval_every 2000"
  [draft]="$GPU_DATA --max_steps 3000"
  [medusa1]="$GPU_DATA --max_steps 2000"
  [medusa2]="$GPU_DATA --max_steps 500"
  [eagle2]="$GPU_DATA --max_steps 3000"
  [eagle3]="$GPU_DATA --max_steps 3000"
  [peagle]="$GPU_DATA --max_steps 3000"
  [dflash]="$GPU_DATA --max_steps 3000"
)

command_of() {  # the exact command of a stage, into the array CMD (and, quoted, what the manifest records)
  CMD=(python "train/${SCRIPT[$1]}" --config "${RECIPE[$1]}" --output_dir "$OUT/$1" --cache_dir "$OUT/cache")
  [[ -z ${CORPUS:-} ]] || CMD+=(--corpus "$CORPUS")
  eval "CMD+=(${FLAGS[$1]})"
  # shellcheck disable=SC2206  # the GPU flags are plain words
  [[ $GPU == 0 ]] || CMD+=("${GPU_COMMON[@]}" ${GPU_FLAGS[$1]})
}
quoted() { command_of "$1"; printf '%q ' "${CMD[@]}" | sed 's/ $//'; }
run() { echo "+ $(printf '%q ' "$@" | sed 's/ $//')"; [[ -n ${DRY_RUN:-} ]] || "$@"; }
stage() {
  if [[ -f $OUT/$1/final/train_report.json ]]; then echo "= $1: done ($OUT/$1/final)"; return 0; fi
  echo "+ $(quoted "$1") > $(printf '%q' "$OUT/$1.log")"
  [[ -n ${DRY_RUN:-} ]] && return 0
  command_of "$1"
  "${CMD[@]}" > "$OUT/$1.log" 2>&1 || { echo "stage $1 failed: see $OUT/$1.log" >&2; return 1; }
}

stage target
# the target's own text and its hidden states (every layer any drafter reads), once for every drafter
prepare() {
  CMD=(python train/prepare_data.py --config recipes/eagle/eagle3_reference.yaml --target "$TARGET"
       --cache_dir "$OUT/cache" --output_dir "$OUT/prepare" --layers auto)
  [[ -z ${CORPUS:-} ]] || CMD+=(--corpus "$CORPUS")
  # shellcheck disable=SC2206
  [[ $GPU == 0 ]] || CMD+=($GPU_DATA)
  echo "+ $(printf '%q ' "${CMD[@]}" | sed 's/ $//') > $(printf '%q' "$OUT/prepare.log")"
  [[ -n ${DRY_RUN:-} ]] && return 0
  "${CMD[@]}" > "$OUT/prepare.log" 2>&1 || { echo "stage prepare failed: see $OUT/prepare.log" >&2; return 1; }
}
prepare
if [[ $GPU == 1 ]]; then  # one GPU: one stage at a time
  for s in draft eagle2 eagle3 peagle dflash medusa1 medusa2; do stage $s; done
else
  # two lanes of one-thread jobs use both cores better than one two-thread job at a time
  export OMP_NUM_THREADS=1
  ( stage draft && stage eagle2 ) & lane1=$!
  ( stage medusa1 && stage medusa2 ) & lane2=$!
  failed=0
  wait $lane1 || failed=1
  wait $lane2 || failed=1
  [[ $failed == 0 ]] || exit 1
  unset OMP_NUM_THREADS
  stage eagle3
  export OMP_NUM_THREADS=1
  stage peagle & lane1=$!  # P-EAGLE starts from the EAGLE-3 draft
  stage dflash & lane2=$!
  wait $lane1 || failed=1
  wait $lane2 || failed=1
  [[ $failed == 0 ]] || exit 1
  unset OMP_NUM_THREADS
fi

ship() { run python train/ship.py --name "$1" --source "$OUT/$2/final" --recipe "${RECIPE[$2]}" --command "$(quoted "$2")"; }
run python train/ship.py --name tokenizer --source zoo/tokenizer --recipe recipes/zoo/target.yaml \
    --command "$(quoted target) (trained first when tokenizer_dir holds none)"
ship target target
ship draft draft
ship medusa medusa1
ship medusa2 medusa2
ship eagle eagle2
ship eagle3 eagle3
ship peagle peagle
ship dflash dflash
