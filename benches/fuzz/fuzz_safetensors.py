"""Fuzzes `mdsd generate` with a tiny random LLaMA in the Hugging Face layout (config.json,
model.safetensors, tokenizer.json) written here and then corrupted: config values set to 0,
huge, negative or of the wrong type, broken JSON, safetensors headers with bad lengths,
offsets, shapes and dtypes, tokenizers with holes in their ids. Each run must end with exit
status 0 or 1; anything else is printed `BAD`.

    python3 benches/fuzz/fuzz_safetensors.py [FILTER]

Environment: MDSD (default ./target/release/mdsd), FUZZ_DIR (default /tmp/mdsd-fuzz).
Exits 1 if any run was BAD.
"""
import json, struct, random, os, subprocess, copy, shutil, sys
V,H,I,L,NH,KV=48,32,64,2,4,2
hd=H//NH
rng=random.Random(1)
def tensor(dims, scale=0.3, off=0.0):
    n=1
    for d in dims: n*=d
    return dims, struct.pack(f'<{n}f',*[off+scale*(rng.random()*2-1) for _ in range(n)])
W={'model.embed_tokens.weight':tensor([V,H],1.0)}
for i in range(L):
    p=f'model.layers.{i}'
    W[f'{p}.input_layernorm.weight']=tensor([H],0.2,1.0); W[f'{p}.post_attention_layernorm.weight']=tensor([H],0.2,1.0)
    W[f'{p}.self_attn.q_proj.weight']=tensor([H,H]); W[f'{p}.self_attn.k_proj.weight']=tensor([KV*hd,H]); W[f'{p}.self_attn.v_proj.weight']=tensor([KV*hd,H]); W[f'{p}.self_attn.o_proj.weight']=tensor([H,H])
    W[f'{p}.mlp.gate_proj.weight']=tensor([I,H]); W[f'{p}.mlp.up_proj.weight']=tensor([I,H]); W[f'{p}.mlp.down_proj.weight']=tensor([H,I])
W['model.norm.weight']=tensor([H],0.2,1.0); W['lm_head.weight']=tensor([V,H],1.0)
CFG={"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":V,"hidden_size":H,"intermediate_size":I,"num_hidden_layers":L,"num_attention_heads":NH,"num_key_value_heads":KV,"max_position_embeddings":256,"rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":False,"hidden_act":"silu","bos_token_id":1,"eos_token_id":2}
def st_bytes(W, hdr_mut=None):
    hdr={}; off=0; blobs=[]
    for k,(dims,b) in W.items():
        hdr[k]={"dtype":"F32","shape":dims,"data_offsets":[off,off+len(b)]}; off+=len(b); blobs.append(b)
    if hdr_mut: hdr_mut(hdr)
    h=json.dumps(hdr).encode(); h+=b' '*((-len(h))%8)
    return struct.pack('<Q',len(h))+h+b''.join(blobs)
tok={"version":"1.0","truncation":None,"padding":None,"added_tokens":[],"normalizer":None,
 "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":False,"trim_offsets":False,"use_regex":True},"post_processor":None,
 "decoder":{"type":"ByteLevel","add_prefix_space":False,"trim_offsets":False,"use_regex":True},
 "model":{"type":"BPE","dropout":None,"unk_token":None,"continuing_subword_prefix":None,"end_of_word_suffix":None,"fuse_unk":False,"byte_fallback":False,"ignore_merges":False,
 "vocab":{chr(0x21+i):i for i in range(V)},"merges":[]}}
WORK=os.environ.get('FUZZ_DIR','/tmp/mdsd-fuzz')
D=os.path.join(WORK,'hf')
def write(cfg=CFG, st=None, tk=tok):
    shutil.rmtree(D,ignore_errors=True); os.makedirs(D)
    open(f'{D}/config.json','w').write(cfg if isinstance(cfg,str) else json.dumps(cfg))
    open(f'{D}/model.safetensors','wb').write(st if st is not None else st_bytes(W))
    open(f'{D}/tokenizer.json','w').write(tk if isinstance(tk,str) else json.dumps(tk))
muts=[('baseline',lambda: write())]
for k in ["vocab_size","hidden_size","intermediate_size","num_hidden_layers","num_attention_heads","num_key_value_heads","max_position_embeddings"]:
    for v in [0,1,3,7,1000,2**31,2**32-1,2**40,2**63,-1,"12",1.5,None]:
        def f(k=k,v=v):
            c=dict(CFG); c[k]=v
            if v is None: del c[k]
            write(c)
        muts.append((f'{k}={v}',f))
for k in ["rms_norm_eps","rope_theta"]:
    for v in [0,-1,1e400,"nan"]:
        def f(k=k,v=v): c=dict(CFG); c[k]=v; write(json.dumps(c).replace('Infinity','1e400'))
        muts.append((f'{k}={v}',f))
muts+=[('config not json',lambda: write('{"vocab_size": 48,')),('config empty',lambda: write('')),('config array',lambda: write('[]')),
 ('model_type bogus',lambda: write(dict(CFG,model_type='bogus',architectures=['Bogus']))),
 ('tokenizer bad json',lambda: write(tk='{')),
 ('tokenizer vocab short',lambda: write(tk=json.dumps(dict(tok,model=dict(tok['model'],vocab={chr(0x21+i):i for i in range(10)}))))),
 ('tokenizer vocab ids huge',lambda: write(tk=json.dumps(dict(tok,model=dict(tok['model'],vocab={**{chr(0x21+i):i for i in range(V)},'zz':10**9}))))),
 ('st header len huge',lambda: write(st=struct.pack('<Q',2**63)+st_bytes(W)[8:])),
 ('st header not json',lambda: write(st=struct.pack('<Q',8)+b'notjson!'+b'\0'*100)),
 ('st truncated',lambda: write(st=st_bytes(W)[:-100])),
 ('st offsets overflow',lambda: write(st=st_bytes(W,lambda h: h['lm_head.weight'].__setitem__('data_offsets',[0,2**64-1])))),
 ('st offsets reversed',lambda: write(st=st_bytes(W,lambda h: h['lm_head.weight'].__setitem__('data_offsets',[100,0])))),
 ('st shape wrong',lambda: write(st=st_bytes(W,lambda h: h['lm_head.weight'].__setitem__('shape',[H,V])))),
 ('st shape huge',lambda: write(st=st_bytes(W,lambda h: h['lm_head.weight'].__setitem__('shape',[2**40,2**40])))),
 ('st dtype bogus',lambda: write(st=st_bytes(W,lambda h: h['lm_head.weight'].__setitem__('dtype','Q9')))),
 ('st dtype F16',lambda: write(st=st_bytes(W,lambda h: h['lm_head.weight'].__setitem__('dtype','F16')))),
 ('st missing lm_head',lambda: write(st=st_bytes({k:v for k,v in W.items() if k!='lm_head.weight'}))),
 ('st missing layer1 q',lambda: write(st=st_bytes({k:v for k,v in W.items() if k!='model.layers.1.self_attn.q_proj.weight'}))),
 ('st empty',lambda: write(st=b'')),
]
only=sys.argv[1] if len(sys.argv)>1 else ''
nbad=0
for name,f in muts:
    if only and only not in name: continue
    f()
    cmd=[os.environ.get('MDSD','./target/release/mdsd'),'generate','--target',D,'--no-spec','--max-new-tokens','3','--temperature','0','--prompt','ABC']
    try:
        p=subprocess.run(cmd,capture_output=True,timeout=90,env=dict(os.environ,MDSD_CACHE=os.path.join(WORK,'cache'),MDSD_OFFLINE='1',RUST_BACKTRACE='0')); rc=p.returncode; err=p.stderr.decode(errors='replace')
    except subprocess.TimeoutExpired: rc='TIMEOUT'; err=''
    bad = rc=='TIMEOUT' or rc==101 or (isinstance(rc,int) and rc<0) or 'panicked' in err
    tag='BAD ' if bad else ('ok  ' if rc==0 else 'err ')
    lines=[l for l in err.splitlines() if 'error' in l.lower() or 'panick' in l]
    print(f'{tag} rc={rc} [{name}] {" | ".join(lines)[-260:] if rc!=0 else p.stdout.decode(errors="replace")[-40:]!r}',flush=True)
    nbad += bad
print(f'{nbad} BAD runs')
sys.exit(1 if nbad else 0)
