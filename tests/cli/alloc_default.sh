#!/usr/bin/env bash
# alloc_default.sh — what gpumem's default policy promises on real training
# (issue 23), pinned on traces this repository ships: 40-step jobs recorded on
# an H200 by tests/gpu/alloc_suite.py (examples/steps40) and the small
# examples. `gpumem replay` on the sim runs the same policy code as the GPU.
#  - fixed shapes: whole-run peak reserved <= 1.02 x peak allocated, and no
#    device call from 30% of the run on (the plan serves every later step);
#  - a new sequence length every step (no plan: the reserve budget holds
#    it): whole-run peak reserved <= 1.02 x peak allocated, where expandable
#    segments hold 1.087;
#  - small jobs: at most torch default's ratio.
set -u
: "${GPUMEM:?GPUMEM must name the gpumem binary}" "${GPUMEM_SOURCE:?GPUMEM_SOURCE must name the source tree}"
ex=$GPUMEM_SOURCE/examples
fails=0
ratio() { # TRACE CONF [REPLAY OPTIONS] -> "ratio steady_calls"
  "$GPUMEM" replay --conf "$2" "${@:3}" --steady-from 0.3 --json "$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.4f %d" % (r["peak_reserved"]/r["peak_allocated"], r["steady_device_calls"]))'
}
check() { # NAME EXPR-of-r,c,t,e
  echo "$1: default $r ($c calls from 30%), torch $t, expandable $e"
  python3 -c "import sys; r,c,t,e=$r,$c,$t,$e; sys.exit(0 if ($2) else 1)" || { echo "FAIL: $1: $2"; fails=$((fails + 1)); }
}
for name in gpt2_hf llama_ckpt resnet50_amp bert_varlen mlp_adam_fp32 cnn_sgd_amp; do
  tr=$ex/steps40/$name.pickle.gz; [ -f "$tr" ] || tr=$ex/$name.pickle.gz
  read -r r c < <(ratio "$tr" policy:gpumem)
  read -r t _ < <(ratio "$tr" policy:torch)
  read -r e _ < <(ratio "$tr" policy:torch,expandable_segments:True)
  case $name in
    bert_varlen) check "$name" "r <= 1.02 and r < e" ;;
    mlp_adam_fp32|cnn_sgd_amp) check "$name" "r <= t" ;;
    *) check "$name" "r <= 1.02 and c == 0" ;;
  esac
done
# bert_varlen at a per-process cap of 1.03x its peak allocated: within 1.02x
# under the reserve budget. Its device calls from 30% are pinned at what the
# budget alone makes (7,354: placement looks over the whole arena for
# mapped ranges, and the warm-up's end keeps what it mapped; expandable
# segments make 1,577 at this cap): the
# elastic plans that brought them to 1,200 were removed: they cost jobs
# outside the suite 2-6x the calls in replay.
cap=$(python3 -c "print(int(13144518656 * 1.03))")
read -r r c < <(ratio "$ex/steps40/bert_varlen.pickle.gz" policy:gpumem --capacity "${cap}B")
read -r _ e < <(ratio "$ex/steps40/bert_varlen.pickle.gz" policy:torch,expandable_segments:True --capacity "${cap}B")
echo "bert_varlen at 1.03x: default $r ($c calls from 30%), expandable $e calls"
python3 -c "import sys; sys.exit(0 if $r <= 1.02 and $c <= 7354 else 1)" || { echo "FAIL: bert_varlen at 1.03x: want <= 1.02 and <= 7354 calls"; fails=$((fails + 1)); }
[ "$fails" = 0 ] && echo "ok" || { echo "$fails failed"; exit 1; }
