"""Fuzzes `mdsd generate --eagle` with corrupted EAGLE heads: a random head for the SmolLM2
target is written with `bench random-eagle`, then its weights are replaced by broken
`pytorch_model.bin` files (not zips, bad pickles, hand-made pickles whose tensors claim shapes,
offsets and strides their storage cannot hold) or its config.json is corrupted. Each run must
end with exit status 0 or 1; anything else is printed `BAD`.

    python3 benches/fuzz/fuzz_torch_bin.py

Environment: MDSD and BENCH (default ./target/release/{mdsd,bench}), MODEL (default the
SmolLM2 GGUF in $MDSD_CACHE or ~/.cache/mdsd), FUZZ_DIR (default /tmp/mdsd-fuzz).
Exits 1 if any run was BAD.
"""
import os, shutil, subprocess, zipfile, pickle, random, json, struct, sys
WORK=os.environ.get('FUZZ_DIR','/tmp/mdsd-fuzz')
CACHE=os.environ.get('MDSD_CACHE', os.path.expanduser('~/.cache/mdsd'))
T=os.environ.get('MODEL', os.path.join(CACHE,'SmolLM2-135M-Instruct.Q4_1.gguf'))
MDSD=os.environ.get('MDSD','./target/release/mdsd')
BASE=os.path.join(WORK,'eagle-base'); D=os.path.join(WORK,'eagle')
subprocess.run([os.environ.get('BENCH','./target/release/bench'),'random-eagle','--target',T,'--out',BASE,'--dtype','f32'],check=True,capture_output=True)
def fresh(keep_st=True):
    shutil.rmtree(D,ignore_errors=True); shutil.copytree(BASE,D)
    if not keep_st: os.remove(f'{D}/model.safetensors')
def zipbin(files):
    with zipfile.ZipFile(f'{D}/pytorch_model.bin','w') as z:
        for n,b in files.items(): z.writestr(n,b)
cfg=json.load(open(f'{BASE}/config.json'))
r=random.Random(3)
muts=[]
muts.append(('bin random bytes', lambda: (fresh(False), open(f'{D}/pytorch_model.bin','wb').write(bytes(r.randrange(256) for _ in range(5000))))))
muts.append(('bin empty', lambda: (fresh(False), open(f'{D}/pytorch_model.bin','wb').write(b''))))
muts.append(('bin empty zip', lambda: (fresh(False), zipbin({}))))
muts.append(('bin zip garbage pkl', lambda: (fresh(False), zipbin({'archive/data.pkl': bytes(r.randrange(256) for _ in range(300))}))))
muts.append(('bin zip dict of ints', lambda: (fresh(False), zipbin({'archive/data.pkl': pickle.dumps({'fc.weight':1,'fc.bias':2},protocol=2)}))))
muts.append(('bin zip list', lambda: (fresh(False), zipbin({'archive/data.pkl': pickle.dumps([1,2,3],protocol=2)}))))
muts.append(('bin zip truncated pickle', lambda: (fresh(False), zipbin({'archive/data.pkl': pickle.dumps({'a':[1,2,{'b':3}]},protocol=2)[:-5]}))))
# pickle opcodes crafted by hand: stack underflow / bad memo
for name,ops in [('pop empty', b'\x80\x02' + b'0' + b'.'), ('memo get missing', b'\x80\x02' + b'h\x05' + b'.'), ('setitems no mark', b'\x80\x02}' + b'u' + b'.'), ('build empty', b'\x80\x02' + b'b' + b'.'), ('reduce empty', b'\x80\x02R.'), ('tuple2 empty', b'\x80\x02\x86.'), ('global junk', b'\x80\x02cfoo\nbar\n)R.'), ('persid no stack', b'\x80\x02Q.'), ('binpersid str', b'\x80\x02X\x03\x00\x00\x00abcQ.'), ('long1 huge', b'\x80\x02\x8a\xff' + b'\x01'*255 + b'.'), ('binunicode huge len', b'\x80\x02X\xff\xff\xff\x7f' + b'a'*10 + b'.'), ('stop only', b'.'), ('no stop', b'\x80\x02}')]:
    muts.append((f'pkl {name}', lambda ops=ops: (fresh(False), zipbin({'archive/data.pkl': ops}))))
# torch rebuild with bogus storage: persistent id tuple ('storage', FloatStorage, key, location, numel)
def rebuild(size, stride, offset, numel, key='0', data_len=16, storage='FloatStorage'):
    p = b'\x80\x02}q\x00X\t\x00\x00\x00fc.weightq\x01'
    p += b'ctorch._utils\n_rebuild_tensor_v2\nq\x02('
    p += b'(X\x07\x00\x00\x00storageq\x03ctorch\n' + storage.encode() + b'\nq\x04X' + struct.pack('<I',len(key)) + key.encode() + b'X\x03\x00\x00\x00cpuq\x05J' + struct.pack('<i',numel) + b'tq\x06Q'
    p += b'J' + struct.pack('<i',offset)
    p += b'(' + b''.join(b'J'+struct.pack('<i',x) for x in size) + b't'
    p += b'(' + b''.join(b'J'+struct.pack('<i',x) for x in stride) + b't'
    p += b'\x89ccollections\nOrderedDict\n)R'
    p += b'tR'  # call rebuild
    p += b's.'
    return p
for name,args in [('ok-ish',([4,4],[4,1],0,16)),('size beyond storage',([1000,1000],[1000,1],0,16)),('offset beyond',([4,4],[4,1],10**9,16)),('negative size',([-4,4],[4,1],0,16)),('huge numel',([46340,46340],[46340,1],0,2**31-1)),('shape of 2^60 values',([2**30,2**30],[2**30,1],0,16)),('shape of 2^33 values',([2**31-1,4],[4,1],0,16)),('zero stride',([4,4],[0,0],0,16)),('rank 0',([],[],0,16)),('missing key',([4,4],[4,1],0,16,'9')),('bad storage type',([4,4],[4,1],0,16,'0',16,'WeirdStorage'))]:
    def f(args=args):
        fresh(False)
        a=list(args); key=a[4] if len(a)>4 else '0'; st=a[6] if len(a)>6 else 'FloatStorage'
        zipbin({'archive/data.pkl': rebuild(a[0],a[1],a[2],a[3],key,16,st), 'archive/data/0': b'\0'*64})
    muts.append((f'rebuild {name}',f))
for k,v in [('hidden_size',0),('hidden_size',2**40),('num_attention_heads',0),('num_key_value_heads',0),('vocab_size',10),('vocab_size',2**40),('max_position_embeddings',2**40),('intermediate_size',0),('num_hidden_layers',2**40)]:
    def f(k=k,v=v): fresh(); c=dict(cfg); c[k]=v; json.dump(c,open(f'{D}/config.json','w'))
    muts.append((f'config {k}={v}',f))
muts.append(('config missing', lambda: (fresh(), os.remove(f'{D}/config.json'))))
muts.append(('no weights', lambda: fresh(False)))
bad=0
for name,f in muts:
    f()
    cmd=[MDSD,'generate','--target',T,'--eagle',D,'--prompt','Hi','--max-new-tokens','3','--tree','chain-2']
    try:
        p=subprocess.run(cmd,capture_output=True,timeout=120,env=dict(os.environ,MDSD_OFFLINE='1',RUST_BACKTRACE='0',MDSD_CACHE=os.path.join(WORK,'cache'))); rc=p.returncode; err=p.stderr.decode(errors='replace')
    except subprocess.TimeoutExpired: rc='TIMEOUT'; err=''
    b_ = rc=='TIMEOUT' or rc==101 or (isinstance(rc,int) and rc<0) or 'panicked' in err
    bad+=b_
    lines=[l for l in err.splitlines() if 'error' in l.lower() or 'panick' in l]
    print(('BAD ' if b_ else 'ok  ' if rc==0 else 'err ')+f'rc={rc} [{name}] '+' | '.join(lines)[-250:],flush=True)
print(f'{bad} BAD runs')
sys.exit(1 if bad else 0)
