"""Which recycling estimates pay? An offline replay of greedy first turns with four variants of the table and estimates.

    python benchmarks/scripts/recycling_variants.py [--limit 40] [--cache FILE.npz]

The default GGUF on llama.cpp (2 threads) answers the first ``--limit`` MT-Bench first turns by plain greedy decoding,
128 tokens at most, each row's top-8 token ids and softmax probabilities kept in ``--cache`` (a rerun decodes only
what is missing). Then each variant replays the answers in order with one table across them, as decoding with the
recycling drafter alone would step at B rows (the root + B - 1 guesses, grown best-first by path product, learnt from
the emitted tokens; the table holds the accepted path's rows only, so a real run, which fills it from every row,
does a little better):
  rank: estimates by (depth, rank), the token table; prob: by (depth class, the row's probability bin);
  bigram: prob's, plus a table per token pair (the pair's row first); trigram: bigram's plus a three-token table.
Printed: tokens per step at 2 / 4 / 8 rows per variant (figures in ``ppd_core/drafters/recycling.py``).
"""
import argparse
import heapq
import sys
import time
from pathlib import Path

import numpy as np

from app.questions import DEFAULT_QUESTIONS, read_questions
from ppd_core import Engine, EngineConfig


def decode_all(limit: int, path: Path) -> None:
    """Plain greedy answers with each row's top-8 ids and probabilities (first turns), cached in ``path``."""
    stored = dict(np.load(path)) if path.exists() else {}
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="auto", auto_calibrate=False, threads=2))
    dec, eos = engine.loaded.backend, engine.loaded.eos_token_ids
    stored["vocab_size"] = np.array([dec.vocab_size])
    for i, q in enumerate(read_questions(DEFAULT_QUESTIONS, limit)):
        if f"answer{i}" in stored: continue
        t0 = time.time()
        prompt = engine.chat_ids([{"role": "user", "content": q.turns[0]}])
        cache = dec.new_cache(); logits = dec.prefill(cache, prompt)
        ans, ids, probs = [], [], []
        while True:
            row = logits.rows(np.array([0]))[0].astype(np.float64)
            top = logits.top_k(np.array([0]), 8)[0]
            p = np.exp(row - row.max()); p /= p.sum()
            ids.append(top); probs.append(p[top]); ans.append(int(top[0]))
            if ans[-1] in eos or len(ans) >= 128: break
            logits = dec.prefill(cache, [ans[-1]])
        dec.truncate(cache, 0)
        stored |= {f"prompt{i}": np.array(prompt), f"answer{i}": np.array(ans), f"ids{i}": np.array(ids, np.int32), f"probs{i}": np.array(probs, np.float32)}
        np.savez(path, **stored)
        print(i, len(ans), round(time.time()-t0,1), flush=True)
    engine.close()


K = 8
V = 0
answers: list[dict] = []
BINS = np.array([0, .05, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1.01])
class Est:
    def __init__(s, classes, prior):
        s.tried = np.zeros(classes); s.acc = np.zeros(classes); s.prior = np.array(prior); s.w = 4.0
    def p(s, c): return (s.acc[c] + s.w * s.prior[c]) / (s.tried[c] + s.w)
    def add(s, c, ok): s.tried[c] += 1; s.acc[c] += ok

class Drafter:
    def __init__(s, mode, maxdepth=6, width=4):
        s.mode = mode; s.ids = np.full((V, K), -1, np.int32); s.pr = np.zeros((V, K), np.float32)
        s.big = {}; s.tri = {}; s.last2 = -1  # (prev, tok) -> (ids, probs)
        s.maxdepth, s.width = maxdepth, width
        nb = len(BINS) - 1
        if mode == "rank":
            prior = [[0.3, .1, .05, .03, .02, .02, .01, .01][r] for d in range(6) for r in range(K)]
            s.est = Est(6 * K, prior)
        else:  # (source uni/bi, depthclass 1/2/3+, prob bin)
            centers = (BINS[:-1] + np.minimum(BINS[1:], 1)) / 2
            prior = [c * 0.8 for src in range(3) for d in range(3) for c in centers]
            s.est = Est(3 * 3 * nb, prior)
    def update(s, prev, tok, ids, probs):
        s.ids[tok] = ids; s.pr[tok] = probs
        if s.mode in ("bigram", "trigram"): s.big[(prev, tok)] = (ids, probs)
        if s.mode == "trigram": s.tri[(s.last2, prev, tok)] = (ids, probs)
    def cls(s, depth, rank, prob, src):
        if s.mode == "rank": return (min(depth, 6) - 1) * K + rank
        b = np.searchsorted(BINS, prob, side="right") - 1
        return (src * 3 + min(depth, 3) - 1) * (len(BINS) - 1) + b
    def children(s, prev, tok, depth, prev2=-2):
        src = 0; row = None
        if s.mode == "trigram" and (prev2, prev, tok) in s.tri: row = s.tri[(prev2, prev, tok)]; src = 2
        if row is None and s.mode in ("bigram", "trigram") and (prev, tok) in s.big: row = s.big[(prev, tok)]; src = 1
        if row is None:
            if s.ids[tok, 0] < 0: return []
            row = (s.ids[tok], s.pr[tok])
        out = []
        for r in range(s.width if depth == 1 else 2):
            t = int(row[0][r]);
            if t < 0: break
            c = s.cls(depth, r, float(row[1][r]), src)
            out.append((t, c))
        return out
    def propose(s, prev, root, budget, prev2=-1):
        s.prev2 = prev2
        # best-first: nodes (token, parent, depth, cls, pathprob)
        nodes, heap, cnt = [], [], 0
        cand = []  # every generated candidate (for learning)
        def push(parent, ptok, pprev, depth, pp, pprev2):
            nonlocal cnt
            if depth > s.maxdepth: return
            for t, c in s.children(pprev, ptok, depth, pprev2):
                q = pp * s.est.p(c); cand.append((t, parent, depth, c))
                heapq.heappush(heap, (-q, cnt, t, parent, depth, c, (ptok, pprev))); cnt += 1
        push(-1, root, prev, 1, 1.0, s.prev2)
        idx_of_cand = {}
        while heap and len(nodes) < budget:
            negq, _, t, parent, depth, c, (ptok, pprev) = heapq.heappop(heap)
            if any(nodes[j][0] == t and nodes[j][1] == parent for j in range(len(nodes))): continue
            nodes.append((t, parent, depth, c)); i = len(nodes) - 1
            push(i, t, ptok, depth + 1, -negq, pprev)
        return nodes, cand
def accepted_len(nodes, future):
    node, a = -1, 0
    while a < len(future):
        nxt = next((j for j, (t, p, d, c) in enumerate(nodes) if p == node and t == future[a]), None)
        if nxt is None: break
        node, a = nxt, a + 1
    return a, node

def run(mode, budget, extra=None):
    dr = Drafter(mode, **(extra or {}))
    steps = toks = 0
    for A in answers:
        ans, ids, probs, prompt = A["answer"], A["ids"], A["probs"], A["prompt"]
        dr.last2 = prompt[-3]; dr.update(prompt[-2], prompt[-1], ids[0], probs[0])
        nxt = 0
        for t in range(len(ans) - 1):
            if nxt == t:
                prev = ans[t - 1] if t else prompt[-1]
                future = ans[t + 1:]
                prev2 = ans[t - 2] if t >= 2 else (prompt[-1] if t == 1 else prompt[-2])
                nodes, cand = dr.propose(prev, ans[t], budget - 1, prev2)
                a, _ = accepted_len(nodes, future)
                a = min(a, len(future) - 1); emitted = future[:a + 1]
                # learn: all kept nodes whose parent path was emitted
                path_ok = {-1: 0}  # node -> depth of emitted prefix matched
                for j, (tk, p, d, c) in enumerate(nodes):
                    if p in path_ok and path_ok[p] == d - 1 and d <= len(emitted):
                        ok = tk == emitted[d - 1]; dr.est.add(c, ok)
                        if ok: path_ok[j] = d
                steps += 1; toks += len(emitted); nxt = t + len(emitted)
            dr.last2 = ans[t - 2] if t >= 2 else (prompt[-1] if t == 1 else prompt[-2])
            dr.update(ans[t - 1] if t else prompt[-1], ans[t], ids[t + 1], probs[t + 1])
    return toks / steps


def main() -> None:
    global V, answers
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--cache", default="recycling-variants.npz")
    args = parser.parse_args()
    decode_all(args.limit, Path(args.cache))
    stored = np.load(args.cache)
    V = int(stored["vocab_size"][0])
    answers = [dict(prompt=stored[f"prompt{i}"].tolist(), answer=stored[f"answer{i}"].tolist(), ids=stored[f"ids{i}"],
                    probs=stored[f"probs{i}"]) for i in range(args.limit)]
    for budget in (2, 4, 8):
        print(budget, "rows:", {m: round(run(m, budget), 3) for m in ("rank", "prob", "bigram", "trigram")}, flush=True)


if __name__ == "__main__":
    main()
