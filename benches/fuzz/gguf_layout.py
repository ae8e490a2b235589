"""Reads and writes GGUF v3 headers (metadata, tensor directory) in plain Python, for the fuzzers."""
import struct, sys
T = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',8:'str',9:'arr',10:'Q',11:'q',12:'d'}
class R:
    def __init__(s,b): s.b=b; s.p=0
    def u(s,f):
        v=struct.unpack_from('<'+f,s.b,s.p)[0]; s.p+=struct.calcsize(f); return v
    def s(s):
        n=s.u('Q'); v=s.b[s.p:s.p+n]; s.p+=n; return v
def read_val(r,t):
    if t==8: return r.s()
    if t==9:
        et=r.u('I'); n=r.u('Q'); return (et,[read_val(r,et) for _ in range(n)])
    return r.u(T[t])
def parse(b):
    r=R(b); assert b[:4]==b'GGUF'; r.p=4
    ver=r.u('I'); nt=r.u('Q'); nk=r.u('Q')
    kv=[]
    for _ in range(nk):
        k=r.s(); t=r.u('I'); kv.append([k,t,read_val(r,t)])
    ti=[]
    for _ in range(nt):
        n=r.s(); nd=r.u('I'); dims=[r.u('Q') for _ in range(nd)]; dt=r.u('I'); off=r.u('Q')
        ti.append([n,dims,dt,off])
    align=32
    for k,t,v in kv:
        if k==b'general.alignment': align=v
    start=(r.p+align-1)//align*align
    return ver,kv,ti,b[start:]
def wval(t,v):
    if t==8: return struct.pack('<Q',len(v))+v
    if t==9:
        et,vs=v; return struct.pack('<IQ',et,len(vs))+b''.join(wval(et,x) for x in vs)
    return struct.pack('<'+T[t],v)
def write(ver,kv,ti,data,align=32,raw_align=None):
    out=b'GGUF'+struct.pack('<IQQ',ver,len(ti),len(kv))
    for k,t,v in kv: out+=struct.pack('<Q',len(k))+k+struct.pack('<I',t)+wval(t,v)
    for n,dims,dt,off in ti:
        out+=struct.pack('<Q',len(n))+n+struct.pack('<I',len(dims))+b''.join(struct.pack('<Q',d) for d in dims)+struct.pack('<IQ',dt,off)
    a = raw_align or align
    pad=(-len(out))%a
    return out+b'\0'*pad+data
