#!/usr/bin/env python3
# bench/plan_measure.py — the gpumem_plan:on table of bench/gpumem_policy_tradeoff.md ("Planned steps").
# Run from the repository root after building build-rel (Release).
import json,subprocess,sys,os
G="build-rel/gpumem"
traces=[f"examples/{n}.pickle.gz" for n in ["cnn_sgd_amp","gpt2_small_train_bf16","mlp_adam_fp32","resnet50_train_fp16","transformer_varlen_bf16"]]+[f"../shared/traces/{n}.pickle.gz" for n in ["bert_base_varseq_fp16","gpt2_generate_kvcache","gpt2_small_adamw_bf16","resnet50_sgd_amp"]]
def run(t,conf,cap=None,sf=None):
    a=[G,"replay",t,"--policy","gpumem","--json"]
    if conf: a+=["--conf",conf]
    if cap: a+=["--capacity",str(cap)]
    if sf: a+=["--steady-from",str(sf)]
    r=subprocess.run(a,capture_output=True,text=True)
    if r.returncode not in (0,1): return None
    try: return json.loads(r.stdout)
    except Exception: return None
rows=[]
for t in traces:
    n=os.path.basename(t).replace(".pickle.gz","")
    base=run(t,None)
    cap=int(base["peak_requested"]*1.01)
    for capn,c in (("uncapped",None),("1.01x",cap)):
        for conf in (None,"gpumem_plan:on"):
            d=run(t,conf,c); d2=run(t,conf,c,0.85)
            if d is None: print(n,capn,conf,"failed");continue
            calls=sum(d["device_calls"].values())
            first=calls-d["steady_device_calls"]
            print(f"| {n} | {capn} | {'plan:on' if conf else 'default'} | {d['steady_ratio']:.4f} | {d['steady_device_calls']} | {d2['steady_ratio']:.4f} | {d2['steady_device_calls']} | {d['ratio']:.4f} | {first} | {'OOM' if d['oom'] else ''} |",flush=True)
