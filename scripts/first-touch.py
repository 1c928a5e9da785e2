#!/usr/bin/env python3
"""First touch: the README's first requests as a newcomer sends them (no
max_tokens, no temperature), N times, one after another, against
`gateway up` on 127.0.0.1:8080. Prints how many ended with finish_reason
"stop" and the full-reply p50/p99 (BENCHMARKS.md, "Replies that end").

Usage: python3 scripts/first-touch.py N stream|body [MODEL]
"""
import json, time, sys, urllib.request

# The client's patience per request, in seconds (an impatient SDK user's).
TIMEOUT = 15
N=int(sys.argv[1]); stream = sys.argv[2]=="stream"; model=sys.argv[3] if len(sys.argv)>3 else "base"
res=[]
for i in range(N):
    body={"model":model,"messages":[{"role":"user","content":"Hello" if stream else "Hi"}]}
    if stream: body["stream"]=True
    req=urllib.request.Request("http://127.0.0.1:8080/v1/chat/completions", data=json.dumps(body).encode(), headers={"Authorization":"Bearer sk-local-dev","Content-Type":"application/json"})
    t=time.time(); fin=None; toks=None; text=""
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            if stream:
                for line in r:
                    line=line.decode().strip()
                    if line.startswith("data: ") and line!="data: [DONE]":
                        c=json.loads(line[6:])
                        for ch in c.get("choices",[]):
                            if ch.get("finish_reason"): fin=ch["finish_reason"]
                            text+=ch.get("delta",{}).get("content") or ""
            else:
                c=json.loads(r.read()); fin=c["choices"][0]["finish_reason"]; toks=c["usage"]["completion_tokens"]; text=c["choices"][0]["message"]["content"]
    except Exception as e:
        fin="error:"+str(e)[:40]
    res.append((fin, time.time()-t, toks, len(text)))
stops=sum(1 for r in res if r[0]=="stop")
ts=sorted(r[1] for r in res)
import math
p=lambda q: ts[min(len(ts)-1, int(math.ceil(q*len(ts)))-1)]
print(f"{'stream' if stream else 'body'} {model}: {stops}/{N} stop; p50 {p(0.5):.2f}s p99 {p(0.99):.2f}s max {ts[-1]:.2f}s; finishes {sorted(set(str(r[0]) for r in res))}; chars {[r[3] for r in res][:10]}")
