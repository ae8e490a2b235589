"""Sends malformed and extreme requests to a running `mdsd serve` and prints each status: every
one must be answered (a 4xx for what is refused) except a body announced beyond 1 GiB, which
is left unanswered by design, and `/health` must answer at the end.

    mdsd serve --target MODEL --port 8765 &
    python3 benches/fuzz/fuzz_serve.py            # MDSD_PORT (default 8765)
"""
import os
import http.client, json, socket
H=('127.0.0.1',int(os.environ.get('MDSD_PORT','8765')))
def req(method, path, body=None, raw=None, headers=None):
    c=http.client.HTTPConnection(*H, timeout=60)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h={'Content-Type':'application/json'}; h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r=c.getresponse(); t=r.read().decode(errors='replace')
        return r.status, t[:160].replace('\n',' ')
    except Exception as e:
        return 'EXC', repr(e)[:160]
    finally: c.close()
C='/v1/completions'; CH='/v1/chat/completions'
cases=[
 ('not json', 'POST', C, None, b'{{{'),
 ('empty body', 'POST', C, None, b''),
 ('array body', 'POST', C, [1,2], None),
 ('prompt int', 'POST', C, {'prompt':5}, None),
 ('prompt list of ints', 'POST', C, {'prompt':[1,2,3],'max_tokens':2}, None),
 ('prompt token id huge', 'POST', C, {'prompt':[10**9],'max_tokens':2}, None),
 ('prompt token id negative', 'POST', C, {'prompt':[-1],'max_tokens':2}, None),
 ('prompt empty', 'POST', C, {'prompt':'','max_tokens':2}, None),
 ('max_tokens negative', 'POST', C, {'prompt':'hi','max_tokens':-1}, None),
 ('max_tokens huge', 'POST', C, {'prompt':'hi','max_tokens':10**18}, None),
 ('max_tokens float', 'POST', C, {'prompt':'hi','max_tokens':2.5}, None),
 ('temperature negative', 'POST', C, {'prompt':'hi','max_tokens':2,'temperature':-1}, None),
 ('temperature nan str', 'POST', C, {'prompt':'hi','max_tokens':2,'temperature':'nan'}, None),
 ('temperature huge', 'POST', C, {'prompt':'hi','max_tokens':2,'temperature':1e300}, None),
 ('top_p 0', 'POST', C, {'prompt':'hi','max_tokens':2,'top_p':0}, None),
 ('top_p 2', 'POST', C, {'prompt':'hi','max_tokens':2,'top_p':2}, None),
 ('top_k negative', 'POST', C, {'prompt':'hi','max_tokens':2,'top_k':-5}, None),
 ('top_k huge', 'POST', C, {'prompt':'hi','max_tokens':2,'top_k':10**12}, None),
 ('min_p 5', 'POST', C, {'prompt':'hi','max_tokens':2,'min_p':5}, None),
 ('n 0', 'POST', C, {'prompt':'hi','max_tokens':2,'n':0}, None),
 ('n 1000', 'POST', C, {'prompt':'hi','max_tokens':2,'n':1000}, None),
 ('logprobs huge', 'POST', C, {'prompt':'hi','max_tokens':2,'logprobs':10**6}, None),
 ('logprobs negative', 'POST', C, {'prompt':'hi','max_tokens':2,'logprobs':-3}, None),
 ('logit_bias bad key', 'POST', C, {'prompt':'hi','max_tokens':2,'logit_bias':{'abc':5}}, None),
 ('logit_bias huge id', 'POST', C, {'prompt':'hi','max_tokens':2,'logit_bias':{'999999999':5}}, None),
 ('logit_bias nan', 'POST', C, {'prompt':'hi','max_tokens':2,'logit_bias':{'5':1e400}}, None),
 ('logit_bias -100 all', 'POST', C, {'prompt':'hi','max_tokens':2,'logit_bias':{str(i):-100 for i in range(0,49152,1)}}, None),
 ('stop huge list', 'POST', C, {'prompt':'hi','max_tokens':2,'stop':['x']*10000}, None),
 ('stop empty string', 'POST', C, {'prompt':'hi','max_tokens':2,'stop':['']}, None),
 ('seed negative', 'POST', C, {'prompt':'hi','max_tokens':2,'seed':-1}, None),
 ('presence_penalty huge', 'POST', C, {'prompt':'hi','max_tokens':2,'presence_penalty':1e300}, None),
 ('frequency_penalty -inf', 'POST', C, {'prompt':'hi','max_tokens':2,'frequency_penalty':-1e308}, None),
 ('repetition_penalty 0', 'POST', C, {'prompt':'hi','max_tokens':2,'repetition_penalty':0}, None),
 ('stream true', 'POST', C, {'prompt':'hi','max_tokens':2,'stream':True}, None),
 ('stream string', 'POST', C, {'prompt':'hi','max_tokens':2,'stream':'yes'}, None),
 ('echo + logprobs', 'POST', C, {'prompt':'hi','max_tokens':0,'echo':True,'logprobs':3}, None),
 ('long prompt', 'POST', C, {'prompt':'hello '*5000,'max_tokens':2}, None),
 ('chat no messages', 'POST', CH, {'max_tokens':2}, None),
 ('chat messages empty', 'POST', CH, {'messages':[],'max_tokens':2}, None),
 ('chat bad role', 'POST', CH, {'messages':[{'role':'alien','content':'hi'}],'max_tokens':2}, None),
 ('chat content null', 'POST', CH, {'messages':[{'role':'user','content':None}],'max_tokens':2}, None),
 ('chat content list', 'POST', CH, {'messages':[{'role':'user','content':[{'type':'text','text':'hi'}]}],'max_tokens':2}, None),
 ('chat content image', 'POST', CH, {'messages':[{'role':'user','content':[{'type':'image_url','image_url':{'url':'x'}}]}],'max_tokens':2}, None),
 ('chat message not object', 'POST', CH, {'messages':['hi'],'max_tokens':2}, None),
 ('chat top_logprobs 100', 'POST', CH, {'messages':[{'role':'user','content':'hi'}],'max_tokens':2,'logprobs':True,'top_logprobs':100}, None),
 ('chat tools', 'POST', CH, {'messages':[{'role':'user','content':'hi'}],'max_tokens':2,'tools':[{'type':'function'}]}, None),
 ('GET completions', 'GET', C, None, None),
 ('unknown path', 'POST', '/v1/foo', {}, None),
 ('path traversal', 'GET', '/../../etc/passwd', None, None),
 ('huge content-length', 'POST', C, None, b'{}', {'Content-Length':'99999999999'}),
 ('models', 'GET', '/v1/models', None, None),
 ('health', 'GET', '/health', None, None),
]
for case in cases:
    name,m,path,body,raw=case[:5]; hd=case[5] if len(case)>5 else None
    st,t=req(m,path,body,raw,hd)
    print(f'{st} [{name}] {t}', flush=True)
st,t=req('GET','/health'); print('final health', st, t)
raise SystemExit(0 if st == 200 else 1)
