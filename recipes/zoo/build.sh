#!/usr/bin/env bash
# bash recipes/zoo/build.sh
# Rebuilds the whole default model family (target, then every drafter trained on that target) and ships it
# into zoo/ with its manifest. Resumable: a stage whose final model exists (<OUT>/<stage>/final/
# train_report.json, written last) is skipped, and a killed stage resumes from its last checkpoint when the
# script is started again. Each stage logs to <OUT>/<stage>.log.
#   OUT=runs            where the runs go (no spaces)
#   CORPUS=python       override every recipe's corpus (python: the stdlib + draftkit's dependencies)
#   DRY_RUN=1           print the commands (and which stages are done) without running anything
# On 2 CPU cores: about 45 min for the target, about 40 min for two lanes of drafters, 8 min for EAGLE-3.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs}
TARGET=$OUT/target/final
mkdir -p "$OUT"

declare -A SCRIPT RECIPE FLAGS
def() { SCRIPT[$1]=$2; RECIPE[$1]=$3; FLAGS[$1]="${*:4}"; }
def target  pretrain.py recipes/zoo/target.yaml
def draft   draft.py    recipes/draft/distill.yaml  --target "$TARGET"
def medusa1 medusa.py   recipes/medusa/medusa1.yaml --target "$TARGET"
def medusa2 medusa.py   recipes/medusa/medusa2.yaml --target "$TARGET" --init_heads "$OUT/medusa1/final"
def eagle2  eagle.py    recipes/eagle/eagle2_reference.yaml   --target "$TARGET"
def eagle3  eagle.py    recipes/eagle/eagle3_reference.yaml   --target "$TARGET"

command_of() {  # the exact command of a stage (also what the manifest records)
  local c="python train/${SCRIPT[$1]} --config ${RECIPE[$1]} --output_dir $OUT/$1 --cache_dir $OUT/cache"
  [[ -z ${CORPUS:-} ]] || c+=" --corpus $CORPUS"
  [[ -z ${FLAGS[$1]} ]] || c+=" ${FLAGS[$1]}"
  echo "$c"
}
run() { echo "+ $*"; [[ -n ${DRY_RUN:-} ]] || "$@"; }
stage() {
  if [[ -f $OUT/$1/final/train_report.json ]]; then echo "= $1: done ($OUT/$1/final)"; return 0; fi
  echo "+ $(command_of "$1") > $OUT/$1.log"
  [[ -n ${DRY_RUN:-} ]] && return 0
  # shellcheck disable=SC2046  # the command is split into words on purpose
  $(command_of "$1") > "$OUT/$1.log" 2>&1 || { echo "stage $1 failed: see $OUT/$1.log" >&2; return 1; }
}

stage target
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

ship() { run python train/ship.py --name "$1" --source "$OUT/$2/final" --recipe "${RECIPE[$2]}" --command "$(command_of "$2")"; }
run python train/ship.py --name tokenizer --source zoo/tokenizer --recipe recipes/zoo/target.yaml \
    --command "$(command_of target) (trained first when tokenizer_dir holds none)"
ship target target
ship draft draft
ship medusa medusa1
ship medusa2 medusa2
ship eagle eagle2
ship eagle3 eagle3
