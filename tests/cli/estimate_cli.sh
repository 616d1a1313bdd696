#!/usr/bin/env bash
# estimate_cli.sh — 'gpumem estimate': the JSON's fields and integer bytes,
# the strategies table, --fit, --config with a Hugging Face config.json, and
# every input error (unknown model / model type / architecture / flag, a
# missing config key, impossible or negative sizes) exiting 2 with a message
# that names what is wrong.
set -u
: "${GPUMEM:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$GPUMEM" estimate --model gpt2 --batch 8 --seq 1024 --capacity 80GiB --json) || fail "exit $?"
echo "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert isinstance(j["peak_allocated"], int) and j["peak_allocated"] > 0
assert j["peak_reserved"]["torch"] >= j["peak_allocated"]
assert j["device_total"]["torch"] == j["peak_reserved"]["torch"] + j["cuda_context"]
cats = j["by_category"]
assert set(cats) == {"parameters", "gradients", "optimizer_state", "activations", "temporaries"}, cats
assert all(isinstance(v, int) for v in cats.values())
for s in ("first_step", "later_steps"):
    assert set(j["phases"][s]) == {"forward", "backward", "optimizer_step"}, j["phases"][s]
names = [s["name"] for s in j["strategies"]]
assert any(n.startswith("precision") for n in names) and "activation checkpointing" in names
assert any(n.startswith("accumulation") for n in names) and any("expandable_segments" in n for n in names)
assert any(n.startswith("optimizer sgd") for n in names)
for s in j["strategies"]:
    assert isinstance(s["saving_bytes"], int) and isinstance(s["peak_allocated"], int)
assert j["fits"] is True and j["best_combination"] is not None
' || fail "json: $out"
"$GPUMEM" estimate --model resnet50 --precision fp16-autocast | grep -q "peak allocated" || fail "text output"
# --generate loads the model as Hugging Face users do, from_pretrained(torch_dtype=torch.bfloat16):
# built in 16 bits, so its peak is generating, not an fp32 build-then-cast (issue 42), and it says so;
# --torch-dtype fp32 --precision bf16 is the build-then-cast (.half()) of the measured trace
gen="--model gpt2-medium --batch 16 --seq 64 --generate 200"
out=$("$GPUMEM" estimate $gen) || fail "generate exit"
echo "$out" | grep -q "^loading    from_pretrained(torch_dtype=torch.bfloat16): built in 16 bits" || fail "generate: no loading line: $out"
"$GPUMEM" estimate $gen --torch-dtype fp32 | grep -q "^loading    from_pretrained(torch_dtype=torch.float32)" || fail "--torch-dtype fp32"
"$GPUMEM" estimate $gen --torch-dtype fp16 | grep -q "torch_dtype=torch.float16" || fail "--torch-dtype fp16"
a=$("$GPUMEM" estimate $gen --json) && b=$("$GPUMEM" estimate $gen --torch-dtype fp32 --precision bf16 --json) || fail "generate --json"
python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["run"]["torch_dtype"] == "bf16" and a["run"]["precision"] == "bf16", a["run"]
assert b["run"]["torch_dtype"] == "fp32", b["run"]
params = a["by_category"]["parameters"]
assert a["peak_at"]["phase"] != "setup", a["peak_at"]           # the peak is generating
assert b["peak_at"]["phase"] == "setup", b["peak_at"]           # fp32 + the first 16-bit copy
assert b["peak_allocated"] >= 2 * params > a["peak_allocated"] - a["by_category"]["activations"], (a, b)  # fp32 = 2x bf16
assert any(s["change"] == "--torch-dtype fp32" for s in a["strategies"]), a["strategies"]
assert any(s["change"].startswith("--torch-dtype bf16") and s["saving_bytes"] > 0 for s in b["strategies"]), b["strategies"]
' "$a" "$b" || fail "generate: torch_dtype bf16 vs fp32 then cast"
# the verdict states its rule: whole device + 10% of peak reserved against the capacity
# (issue 42: 22.06 GiB whole device "does NOT fit" 24 GiB, with the margin unsaid)
out=$("$GPUMEM" estimate --model gpt2-medium --batch 6 --capacity 24GiB) || fail "verdict exit"
echo "$out" | grep -Eq "^capacity 24.00 GiB: does NOT fit: whole device 22.06 GiB \+ 10% margin [0-9.]+ GiB = 24.[0-9]+ GiB > 24.00 GiB$" ||
    fail "verdict line: $(echo "$out" | grep capacity)"
# no noise rows: a strategy within 0.05% of the peak ("-512 B (-0.0%)") is named once below the table
echo "$out" | grep -E -- "-?0\.0%\)" && fail "a 0.0% strategy row"
echo "$out" | grep -q "^(the same peak within 0.05%, not listed: precision fp16-autocast, optimizer adam)$" ||
    fail "the strategies with no effect are not named"
"$GPUMEM" estimate --model gpt2-medium --batch 6 --capacity 24GiB --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
res, dev = j["peak_reserved"]["torch"], j["device_total"]["torch"]
assert j["fit_margin"] == 0.1 and j["fit_needed"] == dev + int(res * 0.1), j
assert dev <= j["capacity"] < j["fit_needed"] and j["fits"] is False, j' || fail "verdict JSON"
# checkpointing is Hugging Face only: not offered for torchvision
"$GPUMEM" estimate --model resnet50 --json | python3 -c '
import json, sys; j = json.load(sys.stdin)
assert not any("checkpointing" in s["name"] for s in j["strategies"])' || fail "resnet strategies"
# --fit: an integer that grows with the capacity
f1=$("$GPUMEM" estimate --model gpt2 --seq 512 --capacity 16GiB --fit batch --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fit"]["value"])')
f2=$("$GPUMEM" estimate --model gpt2 --seq 512 --capacity 40GiB --fit batch --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fit"]["value"])')
[ "$f1" -ge 1 ] && [ "$f2" -gt "$f1" ] || fail "--fit batch: $f1 at 16GiB, $f2 at 40GiB"
"$GPUMEM" estimate --model gpt2 --capacity 16GiB --fit seq | grep -q "largest sequence length" || fail "--fit seq"
"$GPUMEM" estimate --model gpt2 --capacity 256MiB --fit batch | grep -q "does not fit" || fail "nothing fits"
# --config, and --opt=value spelling
cat >"$T/llama.json" <<'J'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816,
 "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000}
J
"$GPUMEM" estimate --config="$T/llama.json" --batch=4 --seq=2048 --json | python3 -c '
import json, sys; j = json.load(sys.stdin)
assert j["model"]["parameters"] == 155730944, j["model"]' || fail "--config llama"
# the model's name is the config's path, any bytes: --json stays valid UTF-8 JSON
cp "$T/llama.json" "$T/bad"$'\xff'".json"
"$GPUMEM" estimate --config="$T/bad"$'\xff'".json" --json | python3 -c '
import json, sys; j = json.loads(sys.stdin.buffer.read().decode("utf-8"))
assert j["model"]["name"].endswith("bad\ufffd.json"), j["model"]' || fail "--config path not UTF-8: --json"

# generation: the peak of ../shared/traces/gpt2_generate_kvcache (measured 1522219008 bytes on the H200)
# is while .half() converts the fp32 model: fp32 parameters + the fp16 embedding
"$GPUMEM" estimate --model gpt2-medium --batch 16 --seq 64 --generate 200 --torch-dtype fp32 --precision bf16 --json | python3 -c '
import json, sys; j = json.load(sys.stdin)
assert j["peak_allocated"] == 1522219008, j["peak_allocated"]
assert j["peak_at"]["phase"] == "setup", j["peak_at"]
assert not any(s["name"].startswith("optimizer") for s in j["strategies"])' || fail "--generate"

# input errors: exit 2 and a message naming the problem
# issue #25: no silent limit. The default precision works with --generate;
# a run past the simulated device's 141 GiB is not capped, and fits is
# never true above the capacity
"$GPUMEM" estimate --model gpt2 --generate 16 --json >/dev/null || fail "--generate with its defaults"
"$GPUMEM" estimate --model gpt2 --batch 160 --capacity 200GiB --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["peak_allocated"] > 200 * 2**30 and j["fits"] is False, (j["peak_allocated"], j["fits"])
assert j["phases"]["later_steps"]["backward"]["peak"] <= j["peak_allocated"]' || fail "batch 160 at 200 GiB"
"$GPUMEM" estimate --model gpt2 --fit batch --capacity 1TiB --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert 500 < j["fit"]["value"] < 2000, j["fit"]' || fail "--fit batch at 1 TiB"
# per rank: FSDP over 8 ranks holds less than one GPU; --fit world finds a count
"$GPUMEM" estimate --model gpt2-medium --batch 4 --seq 512 --world-size 8 --shard fsdp --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["per_rank"] is True and j["run"]["shard"] == "fsdp" and j["run"]["world_size"] == 8
names = [s["name"] for s in j["strategies"]]
assert "shard ddp (per rank)" in names and "shard zero3 (per rank)" in names, names' || fail "--shard fsdp"
"$GPUMEM" estimate --model gpt2-medium --batch 4 --seq 512 --shard fsdp --fit world --capacity 10GiB --json |
    python3 -c 'import json, sys; j = json.load(sys.stdin); assert j["fit"]["what"] == "world" and j["fit"]["value"] >= 2, j["fit"]' ||
    fail "--fit world"

expect2() { # needle, args...
    local needle=$1; shift
    local err rc
    err=$("$GPUMEM" estimate "$@" 2>&1 >/dev/null); rc=$?
    [ $rc -eq 2 ] || fail "estimate $*: exit $rc, expected 2 ($err)"
    echo "$err" | grep -qi -- "$needle" || fail "estimate $*: message '$err' lacks '$needle'"
}
expect2 "unknown model 'gpt5'" --model gpt5
expect2 "unknown option '--bogus'" --model gpt2 --bogus
expect2 "exactly one of" --batch 8
expect2 "exactly one of" --model gpt2 --config "$T/llama.json"
expect2 "--batch wants an integer" --model gpt2 --batch -4
expect2 "--batch wants an integer" --model gpt2 --batch 0
expect2 "--batch wants an integer" --model gpt2 --batch abc
expect2 "--seq wants an integer" --model gpt2 --seq -1
expect2 "exceeds" --model gpt2 --seq 4096
expect2 "vision model" --model resnet50 --seq 128
expect2 "text model" --model gpt2 --image 224
expect2 "torchvision" --model resnet50 --checkpointing
expect2 "always uses scaled_dot_product_attention" --model vit_b_16 --attention eager
expect2 "--capacity wants a size" --model gpt2 --capacity -5GiB
expect2 "--capacity wants a size" --model gpt2 --capacity lots
expect2 "needs --capacity" --model gpt2 --fit batch
expect2 "--fit must be one of batch|seq" --model gpt2 --capacity 80GiB --fit width
expect2 "unknown --precision" --model gpt2 --precision fp8
expect2 "unknown --optimizer" --model gpt2 --optimizer lion
expect2 "needs a value" --model gpt2 --batch
expect2 "takes no value" --model gpt2 --json=yes
expect2 "cannot open" --config "$T/absent.json"
expect2 "masked-lm model" --model bert-base-uncased --generate 10
expect2 "exceed" --model gpt2 --seq 1000 --generate 100 --precision bf16
expect2 "not autocast" --model gpt2 --seq 64 --generate 10 --precision bf16-autocast
expect2 "runs in 16 bits: --precision bf16, or --torch-dtype fp32" --model gpt2 --seq 64 --generate 10 --precision fp32
expect2 "--torch-dtype must be one of" --model gpt2 --seq 64 --generate 10 --torch-dtype int8
expect2 "is an image-classification model" --model resnet50 --generate 10
expect2 "needs --shard" --model gpt2 --world-size 8
expect2 "--fit world needs --shard" --model gpt2 --fit world --capacity 80GiB
expect2 "do not apply" --model gpt2 --seq 64 --generate 10 --precision bf16 --checkpointing
echo '{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}' >"$T/t5.json"
expect2 'model_type "t5"' --config "$T/t5.json"
echo '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64}' >"$T/novocab.json"
expect2 '"vocab_size"' --config "$T/novocab.json"
echo '{"model_type": "bert", "architectures": ["BertForQuestionAnswering"], "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 9, "max_position_embeddings": 64}' >"$T/qa.json"
expect2 "BertForQuestionAnswering" --config "$T/qa.json"
echo '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": -3, "n_embd": 64, "n_head": 2, "vocab_size": 64, "n_positions": 64}' >"$T/neg.json"
expect2 '"n_layer" must be a positive integer' --config "$T/neg.json"
# found by fuzz_estimate_config: a num_labels past int64 was cast (UB); now the default
echo '{"model_type": "vit", "architectures": ["ViTForImageClassification"], "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "image_size": 32, "patch_size": 16, "num_labels": 1e126}' >"$T/vitbig.json"
"$GPUMEM" estimate --config "$T/vitbig.json" --batch 1 >/dev/null || fail "huge num_labels"
echo 'not json' >"$T/bad.json"
expect2 "invalid JSON at byte 0" --config "$T/bad.json"
printf '{"model_type": "gpt2",, "n_layer": 2}' >"$T/comma.json"
expect2 "invalid JSON at byte 23" --config "$T/comma.json"
echo '[1, 2]' >"$T/list.json"
expect2 "not a JSON object" --config "$T/list.json"
# a cut download: say so, and where
printf '{"model_type": "gpt2", "n_layer": 2, "n_em' >"$T/cut.json"
expect2 "truncated JSON at byte 42" --config "$T/cut.json"
"$GPUMEM" estimate --help | grep -q -- "--fit batch|seq" || fail "--help"
expect2 "wants an integer from 2 to 16" --model gpt2 --steps 40
expect2 "--accum wants an integer" --model gpt2 --accum -2

# --trace: a step traced by gpumem.estimate.trace_step (written here by its Trace, no torch needed):
# a 4 MiB weight, its 4 MiB gradient, two 256 KiB tensors; one replay per allocator model
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)/python" python3 -c '
import sys
from gpumem import estimate as ge
t = ge.Trace("meta", "meta", 1, "none")
M = 1 << 20
for i, (a, addr, size, cat) in enumerate([("alloc", 1, 4 * M, "parameters"), ("alloc", 2, M // 4, "activations"),
                                          ("alloc", 3, M // 4, "temporaries"), ("free", 3, M // 4, "temporaries"),
                                          ("alloc", 4, 4 * M, "gradients"), ("free", 2, M // 4, "activations")]):
    t.events.append((a, addr << 32, size, cat, "", "forward"))
t.save(sys.argv[1])' "$T/step.pickle.gz" || fail "writing a trace"
"$GPUMEM" estimate --trace "$T/step.pickle.gz" --capacity 820MiB --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
M = 1 << 20
assert j["peak_allocated"] == 8 * M + M // 4, j
assert set(j["peak_reserved"]) == {"torch", "expandable_segments", "gpumem"}, j
assert j["peak_reserved"]["torch"] == 22 * M, j  # 20 MiB segment for the 4 MiB blocks, 2 MiB small pool
assert j["at_peak"] == {"parameters": 4 * M, "gradients": 4 * M, "optimizer_state": 0, "activations": M // 4,
                        "temporaries": 0, "other": 0}, j
assert j["device_total"] == j["peak_reserved"]["torch"] + j["cuda_context"] and j["fits"] is False, j
assert "does NOT fit" in j["verdict"] and j["margin"] == 0.1, j' || fail "--trace json"
"$GPUMEM" estimate --trace "$T/step.pickle.gz" --capacity 80GiB | grep -q "^capacity 80.00 GiB: fits" || fail "--trace text"
expect2 "without --model" --trace "$T/step.pickle.gz" --model gpt2
err=$("$GPUMEM" estimate --trace "$T/absent.pickle" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$err" | grep -q "absent.pickle" || fail "--trace of a missing file: exit $rc ($err)"
echo 'not a trace' >"$T/junk.pickle"
err=$("$GPUMEM" estimate --trace "$T/junk.pickle" 2>&1); rc=$?
[ $rc -eq 1 ] && [ -n "$err" ] || fail "--trace of junk: exit $rc ($err)"
echo ok
