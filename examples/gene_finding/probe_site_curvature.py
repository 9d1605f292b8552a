"""Probe (CPU): the NLL's slope and curvature along the site scores at the GHMM (site scores 0), on 40 short
training loci scored by a GHMM fitted on 400 others: how far a Newton step would move them, and how much
it would lower the NLL. Prints and writes results/probe_site_curvature.json.
"""
import time, torch, numpy as np, json
from torch_semimarkov.genomics.genbank import load_genbank
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
torch.set_num_threads(1)
recs = load_genbank('examples/gene_finding/data/usr/share/doc/augustus/tutorial/results/genes.gb.train')
rng = np.random.default_rng(0); idx = rng.permutation(len(recs))
train = [recs[i] for i in idx[:400]]; probe = sorted([recs[i] for i in idx[400:]], key=len)[:40]
g = GHMM.fit(train, GHMMConfig(order=3, smoothing=2.0, max_duration=960, intron_tail=960, signal_bases=True))
b = pack([g.features(r) for r in probe], [r.genes for r in probe], dtype=torch.float64, grammar=g.grammar)
crf = FeatureCRF(g)
print("loci", b.batch, "T", b.T, flush=True)
def loss_grad():
    crf.zero_grad()
    nll = crf.nll(b, torch.float64)
    ok = torch.isfinite(nll)
    loss = nll[ok].sum() / ok.sum()
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in crf.named_parameters() if p.grad is not None}
t = time.perf_counter(); L0, G = loss_grad(); print("eval", time.perf_counter() - t, "loss", L0, flush=True)
out = {"loss0": L0}
for n, gr in G.items():
    print(n, "grad norm", float(gr.norm()), "max", float(gr.abs().max()))
    out[n] = float(gr.norm())
# Newton step along the theta gradient alone: curvature by a finite difference of the directional derivative
d = {n: -G[n] for n in G if n.startswith("site_bases")}
dd = sum(float((v * v).sum()) for v in d.values())
eps = 1e-3 / dd ** 0.5
with torch.no_grad():
    for n, p in crf.named_parameters():
        if n in d: p += eps * d[n]
L1, G1 = loss_grad()
slope0 = -dd
slope1 = sum(float((G1[n] * d[n]).sum()) for n in d)
curv = (slope1 - slope0) / eps
step = -slope0 / curv
print("theta: directional slope", slope0, "curvature", curv, "newton step", step, "predicted loss drop per locus", 0.5 * dd * step, flush=True)
print("theta at newton step: max |theta|", step * max(float(v.abs().max()) for v in d.values()))
out.update(slope=slope0, curvature=curv, step=step, drop=0.5 * dd * step)
json.dump(out, open("examples/gene_finding/results/probe_site_curvature.json", "w"))
