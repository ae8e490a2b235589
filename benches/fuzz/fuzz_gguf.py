"""Fuzzes `mdsd generate` with corrupted copies of a GGUF model: metadata values set to 0, odd,
huge or of the wrong type, keys deleted, tensor shapes, types and offsets changed, tensors
dropped, and random byte flips in the header. Each run must end with exit status 0 or 1; a
panic (101), a signal (an abort, or a kill for memory) or a timeout is a defect, printed `BAD`.

    python3 benches/fuzz/fuzz_gguf.py [FILTER] [RANDOM_FLIPS]

Environment: MDSD (default ./target/release/mdsd), MODEL (default the SmolLM2 GGUF in
$MDSD_CACHE or ~/.cache/mdsd), FUZZ_DIR (default /tmp/mdsd-fuzz). Exits 1 if any run was BAD.
"""
import struct, subprocess, random, os, sys, copy
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_layout as gguf
CACHE=os.environ.get('MDSD_CACHE', os.path.expanduser('~/.cache/mdsd'))
SRC=os.environ.get('MODEL', os.path.join(CACHE,'SmolLM2-135M-Instruct.Q4_1.gguf'))
MDSD=os.environ.get('MDSD','./target/release/mdsd')
WORK=os.environ.get('FUZZ_DIR','/tmp/mdsd-fuzz')
os.makedirs(WORK, exist_ok=True)
b=open(SRC,'rb').read()
ver,kv,ti,data=gguf.parse(b)
def K(kv,name): 
    for e in kv:
        if e[0]==name: return e
def setk(name,t,v):
    def f():
        k2=copy.deepcopy(kv); e=K(k2,name)
        if e is None: k2.append([name,t,v])
        else: e[1]=t; e[2]=v
        return gguf.write(ver,k2,ti,data)
    return f
def delk(name):
    def f():
        k2=[e for e in kv if e[0]!=name]; return gguf.write(ver,k2,ti,data)
    return f
def tmod(fn):
    def f():
        t2=copy.deepcopy(ti); fn(t2); return gguf.write(ver,kv,t2,data)
    return f
def tfind(t2,name):
    for e in t2:
        if e[0]==name: return e
muts=[]
arch=[b'llama.block_count',b'llama.context_length',b'llama.embedding_length',b'llama.feed_forward_length',b'llama.attention.head_count',b'llama.attention.head_count_kv',b'llama.vocab_size',b'llama.rope.dimension_count']
for k in arch:
    for v in [0,1,7,2,65,1000,2**31,2**32-1]:
        muts.append((f'{k.decode()}={v}',setk(k,4,v)))
    muts.append((f'{k.decode()} as string',setk(k,8,b'12')))
    muts.append((f'{k.decode()} as f32',setk(k,6,12.0)))
    muts.append((f'{k.decode()} as u64 huge',setk(k,10,2**63)))
for k in [b'llama.rope.freq_base',b'llama.attention.layer_norm_rms_epsilon']:
    for v in [0.0,-1.0,float('nan'),float('inf'),1e30]:
        muts.append((f'{k.decode()}={v}',setk(k,6,v)))
for k in [b'tokenizer.ggml.bos_token_id',b'tokenizer.ggml.eos_token_id',b'tokenizer.ggml.unknown_token_id',b'tokenizer.ggml.padding_token_id']:
    for v in [49152,2**32-1]:
        muts.append((f'{k.decode()}={v}',setk(k,4,v)))
toks=K(kv,b'tokenizer.ggml.tokens')[2]; tt=K(kv,b'tokenizer.ggml.token_type')[2]; mg=K(kv,b'tokenizer.ggml.merges')[2]
muts+=[('tokens truncated to 100',setk(b'tokenizer.ggml.tokens',9,(8,toks[1][:100]))),
 ('tokens empty',setk(b'tokenizer.ggml.tokens',9,(8,[]))),
 ('tokens as u32 array',setk(b'tokenizer.ggml.tokens',9,(4,list(range(49152))))),
 ('tokens duplicated entries',setk(b'tokenizer.ggml.tokens',9,(8,[toks[1][0]]*49152))),
 ('token_type truncated',setk(b'tokenizer.ggml.token_type',9,(5,tt[1][:10]))),
 ('token_type all 3 (control)',setk(b'tokenizer.ggml.token_type',9,(5,[3]*49152))),
 ('merges malformed',setk(b'tokenizer.ggml.merges',9,(8,[b'abc']*10+mg[1][10:]))),
 ('merges unknown tokens',setk(b'tokenizer.ggml.merges',9,(8,[b'\xe2\x98\x83\xe2\x98\x83 zzqq']+mg[1]))),
 ('merges empty',setk(b'tokenizer.ggml.merges',9,(8,[]))),
 ('merges invalid utf8',setk(b'tokenizer.ggml.merges',9,(8,[b'\xff\xfe \xfd']+mg[1]))),
 ('tokens invalid utf8',setk(b'tokenizer.ggml.tokens',9,(8,[b'\xff\xfe']+toks[1][1:]))),
 ('tokenizer model llama',setk(b'tokenizer.ggml.model',8,b'llama')),
 ('tokenizer model bogus',setk(b'tokenizer.ggml.model',8,b'bogus')),
 ('tokenizer pre bogus',setk(b'tokenizer.ggml.pre',8,b'bogus')),
 ('chat template broken',setk(b'tokenizer.chat_template',8,b'{{ broken')),
 ('chat template raises',setk(b'tokenizer.chat_template',8,b'{{ raise_exception("nope") }}')),
 ('chat template empty',setk(b'tokenizer.chat_template',8,b'')),
 ('chat template undefined attr',setk(b'tokenizer.chat_template',8,b'{{ messages[5].content.foo }}')),
 ('chat template as u32',setk(b'tokenizer.chat_template',4,5)),
 ('arch gpt2',setk(b'general.architecture',8,b'gpt2')),
 ('arch qwen2',setk(b'general.architecture',8,b'qwen2')),
 ('arch empty',setk(b'general.architecture',8,b'')),
 ('alignment 0',setk(b'general.alignment',4,0)),
 ('alignment 1',setk(b'general.alignment',4,1)),
 ('alignment 3',setk(b'general.alignment',4,3)),
 ('alignment 64',setk(b'general.alignment',4,64)),
 ('languages nested array',setk(b'general.languages',9,(9,[(9,[(8,[b'en'])])]))),
]
for e in kv: muts.append((f'delete {e[0].decode()}',delk(e[0])))
names=[b'token_embd.weight',b'blk.0.attn_q.weight',b'blk.0.attn_norm.weight',b'output_norm.weight',b'blk.29.ffn_down.weight',b'blk.3.attn_v.weight']
for n in names:
    muts.append((f'drop {n.decode()}',tmod(lambda t2,n=n: t2.remove(tfind(t2,n)))))
    def sd(t2,n=n): e=tfind(t2,n); e[1]=e[1][::-1]
    muts.append((f'swap dims {n.decode()}',tmod(sd)))
    for d in ([0,576],[576,100],[2**40,2**40],[2**63,2],[576],[576,576,1],[1,576],[]):
        def setd(t2,n=n,d=d): tfind(t2,n)[1]=list(d)
        muts.append((f'dims {d} {n.decode()}',tmod(setd)))
    for dt in (0,1,2,3,8,12,14,30,99):
        def setdt(t2,n=n,dt=dt): tfind(t2,n)[2]=dt
        muts.append((f'dtype {dt} {n.decode()}',tmod(setdt)))
    for off in (1,32,2**64-1,2**64-64,10**12):
        def setoff(t2,n=n,off=off): e=tfind(t2,n); e[3]=(e[3]+off)%2**64 if off<2**63 else off
        muts.append((f'offset +{off} {n.decode()}',tmod(setoff)))
hdr_len=len(b)-len(data)
for i in range(int(sys.argv[2]) if len(sys.argv)>2 else 60):
    def flip(i=i):
        bb=bytearray(b); r=random.Random(i)
        region = r.choice(['all','tinfo','start'])
        for _ in range(r.randint(1,4)):
            if region=='tinfo': p=r.randrange(hdr_len-272*60,hdr_len)
            elif region=='start': p=r.randrange(0,4096)
            else: p=r.randrange(0,hdr_len)
            bb[p]=r.randrange(256)
        return bytes(bb)
    muts.append((f'random flips #{i}',flip))
only=sys.argv[1] if len(sys.argv)>1 else ''
bad_runs=0
for name,f in muts:
    if only and only not in name: continue
    path=os.path.join(WORK,'m.gguf')
    open(path,'wb').write(f())
    for extra in ([],['--chat']) if any(w in name for w in ('chat','token')) else ([],):
        cmd=[MDSD,'generate','--target',path,'--no-spec','--max-new-tokens','3','--temperature','0','--prompt','Hello there']+extra
        try:
            p=subprocess.run(cmd,capture_output=True,timeout=90,env=dict(os.environ,MDSD_CACHE=os.path.join(WORK,'cache'),MDSD_OFFLINE='1',RUST_BACKTRACE='0'))
            rc=p.returncode; err=p.stderr.decode(errors='replace')
        except subprocess.TimeoutExpired:
            rc='TIMEOUT'; err=''
        lines=[l for l in err.splitlines() if l.strip()]
        bad = rc=='TIMEOUT' or rc==101 or (isinstance(rc,int) and rc<0) or 'panicked' in err
        nbad = 1 if bad else 0
        tag='BAD ' if bad else ('ok  ' if rc==0 else 'err ')
        last = ' | '.join(l for l in lines if 'error' in l.lower() or 'panick' in l)[-300:] if rc!=0 else (p.stdout.decode(errors='replace')[-60:].replace('\n','\\n'))
        print(f'{tag} rc={rc} [{name}{" chat" if extra else ""}] {last}',flush=True)
        bad_runs += nbad
print(f'{bad_runs} BAD runs')
sys.exit(1 if bad_runs else 0)
