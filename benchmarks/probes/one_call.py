"""GPU probe: one public call at a shape, for a profiler to watch (``ncu -k regex:_blk_chunks_kernel``).

    python benchmarks/probes/one_call.py B,T,K,C [log|max|fwdbwd]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import random_model  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi  # noqa: E402

B, T, K, C = (int(x) for x in sys.argv[1].split(","))
what = sys.argv[2] if len(sys.argv) > 2 else "log"
cum, tr, db, lengths = random_model(B, T, K, C)
if what == "max":
    r = semi_crf_streaming_viterbi(cum.detach(), tr.detach(), db.detach(), lengths, K).scores
elif what == "fwdbwd":
    z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
    r = torch.autograd.grad(z.sum(), cum)[0].abs().max()
else:
    r = semi_crf_streaming_forward(cum.detach(), tr.detach(), db.detach(), lengths, K)
torch.cuda.synchronize()
print(what, (B, T, K, C), r.flatten()[:4].tolist())
