#!/usr/bin/env bash
# alloc_jobs.sh — gpumem's default on the kinds of job a user brings (issue 41),
# pinned on traces recorded on an H100 by tests/gpu/alloc_suite.py
# (examples/jobs/README.md): LoRA with a new length every step, serving
# generate() with a new batch and prompt per request, training with a larger
# no-grad evaluation pass every 5 steps, torch.compile training, a CNN with a
# new image size every step, two jobs held out until 2026-12-07 (T5 with new
# source and target lengths, Faster R-CNN with new image sizes) and three held
# out since (a small Mixtral, ViT at a new resolution every step, a Llama
# fine-tune with a token budget per step), and two that first ran unseen in the
# late night of 2026-12-07 (a Whisper-sized model with a new transcript length
# every step, GPT-2 medium with gradient accumulation over micro-batches of new
# lengths).
# For each: whole-run peak reserved <= 1.02 x peak allocated, and never more
# than expandable segments hold on the same trace; sft_tokens also bounds its
# device calls in the second half; every job waits for its stream (to move
# memory freed since) at most 40 times in the second half, about twice a
# step (t5_varlen 29, the most). compile_train is pinned
# instead at no device call in the second half and below expandable
# segments: its plan (a layout around the weights) holds more than 1.02x in
# replay of the trace recorded under torch, where best fit under the budget
# alone moved granules in every step (2x slower on the H100); on the GPU
# under gpumem it held 1.004x. `gpumem replay` on the sim runs the same policy
# code as the GPU (bench/RESULTS.md, 2026-12-07 and 2026-12-07 afternoon).
set -u
: "${GPUMEM:?GPUMEM must name the gpumem binary}" "${GPUMEM_SOURCE:?GPUMEM_SOURCE must name the source tree}"
fails=0
ratio() { # TRACE CONF -> "ratio steady_calls steady_stream_waits"
  "$GPUMEM" replay --conf "$2" --steady-from 0.5 --json "$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.4f %d %d" % (r["peak_reserved"]/r["peak_allocated"], r["steady_device_calls"], r["steady_stream_waits"]))'
}
for tr in "$GPUMEM_SOURCE"/examples/jobs/*.pickle.gz; do
  name=$(basename "$tr" .pickle.gz)
  read -r r c w < <(ratio "$tr" policy:gpumem)
  read -r t _ _ < <(ratio "$tr" policy:torch)
  read -r e _ _ < <(ratio "$tr" policy:torch,expandable_segments:True)
  echo "$name: default $r ($c device calls, $w stream waits in the second half), torch $t, expandable $e"
  want="r <= 1.02 and r <= e and w <= 40"
  [ "$name" = compile_train ] && want="c == 0 and r <= e"
  # its largest blocks (the logits, ~2 GiB) land over the memory the last
  # step's left mapped (va.c, densest_window): 6,432 calls, 18,850 before
  [ "$name" = sft_tokens ] && want="$want and c <= 10000"
  python3 -c "import sys; r,c,w,e=$r,$c,$w,$e; sys.exit(0 if $want else 1)" ||
    { echo "FAIL: $name: want $want (expandable $e)"; fails=$((fails + 1)); }
done
[ "$fails" = 0 ] && echo "ok" || { echo "$fails failed"; exit 1; }
