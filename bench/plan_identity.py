#!/usr/bin/env python3
# bench/plan_identity.py REF_GPUMEM NEW_GPUMEM — gpumem_plan off (the default) must replay
# byte-identically: `gpumem replay --json` minus "seconds" on the 9 traces x 5 settings
# (uncapped, --capacity 1.01x peak requested, --steady-from 0.85, both, --conf gpumem_plan:off).
# Run from the repository root; exit status 1 on any difference.
import json,subprocess,sys,os
A,B=sys.argv[1],sys.argv[2]  # reference gpumem (main) and this build
traces=[f"examples/{n}.pickle.gz" for n in ["cnn_sgd_amp","gpt2_small_train_bf16","mlp_adam_fp32","resnet50_train_fp16","transformer_varlen_bf16"]]+[f"../shared/traces/{n}.pickle.gz" for n in ["bert_base_varseq_fp16","gpt2_generate_kvcache","gpt2_small_adamw_bf16","resnet50_sgd_amp"]]
bad=0;n=0
for t in traces:
    def run(g,extra):
        r=subprocess.run([g,"replay",t,"--policy","gpumem","--json"]+extra,capture_output=True,text=True)
        d=json.loads(r.stdout); d.pop("seconds",None); return json.dumps(d,sort_keys=True)
    base=json.loads(subprocess.run([A,"replay",t,"--policy","gpumem","--json"],capture_output=True,text=True).stdout)
    cap=str(int(base["peak_requested"]*1.01))
    for extra in ([],["--capacity",cap],["--steady-from","0.85"],["--capacity",cap,"--steady-from","0.85"],["--conf","gpumem_plan:off"]):
        n+=1
        if run(A,extra)!=run(B,extra): bad+=1; print("DIFF",t,extra)
print(f"{n-bad}/{n} identical")
sys.exit(1 if bad else 0)
