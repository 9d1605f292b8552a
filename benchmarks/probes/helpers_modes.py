"""GPU check (issue 25): are the blocked engine's outputs the same bits whoever computes the helpers'
part? The shape of ``test_gpu.py::test_beta_beside_the_forward_is_bitwise_the_usual_backward``
(8 sequences of 3,000 positions, K = 300, C = 40, ragged, both projections; one chunk each, two
helpers per run) through the public forward + backward, in modes:

- beta after the forward / beside it (``BETA_EARLY_OVERRIDE``);
- helpers launched / the run computing their part itself from the start (``HELP_INLINE``);
- runs that wait only ``spin`` polls (``parallel.RUN_SPIN``), so that they go on alone part way;
- no helpers (other sums: equal to rounding only);
- all of these again while another process keeps the GPU busy (``--busy``: a matmul loop).

Each mode's log Z and gradients are compared bitwise (else the largest difference relative to the
largest value) with the first mode's.

    python benchmarks/probes/helpers_modes.py OUT.json
"""
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))


def busy(seconds):
    a = torch.randn(8192, 8192, device="cuda")
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            a = (a @ a).clamp(-1, 1)
        torch.cuda.synchronize()


def main(out_path):
    from conftest import make_inputs

    from torch_semimarkov.api.partition import semi_crf_streaming_forward
    from torch_semimarkov.engines.triton import parallel
    from torch_semimarkov.engines.triton import plan as plan_mod

    cpu = make_inputs(8, 3000, 300, 40, dtype=torch.float32, seed=11, lengths="ragged", proj="both")
    inp = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in cpu.items()}
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")

    def run(early=None, inline=None, helpers=None, spin=None):
        plan_mod.BETA_EARLY_OVERRIDE, plan_mod.HELP_INLINE, plan_mod.HELPERS_OVERRIDE = early, inline, helpers
        old = parallel.RUN_SPIN
        if spin is not None:
            parallel.RUN_SPIN = spin
        try:
            d = {k: (v.detach().clone().requires_grad_(True) if k in names else v) for k, v in inp.items()}
            z = semi_crf_streaming_forward(**d)
            (z * torch.linspace(0.5, 1.5, 8, device="cuda")).sum().backward()
            torch.cuda.synchronize()
            return [z.detach()] + [d[k].grad for k in names]
        finally:
            parallel.RUN_SPIN = old
            plan_mod.BETA_EARLY_OVERRIDE = plan_mod.HELP_INLINE = plan_mod.HELPERS_OVERRIDE = None

    modes = [("after", dict(early=False)), ("beside", dict(early=True)),
             ("after-inline", dict(early=False, inline=True)), ("beside-inline", dict(early=True, inline=True)),
             ("after-spin1", dict(early=False, spin=1)), ("beside-spin1", dict(early=True, spin=1)),
             ("after-spin64", dict(early=False, spin=64)), ("beside-spin64", dict(early=True, spin=64)),
             ("after-nohelpers", dict(early=False, helpers=0)), ("beside-nohelpers", dict(early=True, helpers=0))]
    rep = {"device": torch.cuda.get_device_name(), "modes": {}}
    ref = None
    for phase in ("idle", "busy"):
        proc = None
        if phase == "busy":
            proc = subprocess.Popen([sys.executable, __file__, "--busy", "40"])
            time.sleep(5)
        for name, kw in modes:
            for rep_i in range(2):
                out = run(**kw)
                if ref is None:
                    ref = out
                cmp = {}
                for n, a, b in zip(("log_z",) + names, out, ref):
                    cmp[n] = "equal" if torch.equal(a, b) else float((a - b).abs().max() / b.abs().max())
                key = f"{phase}:{name}:{rep_i}"
                rep["modes"][key] = cmp
                print(key, cmp, flush=True)
        if proc is not None:
            proc.kill()
    json.dump(rep, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--busy":
        busy(float(sys.argv[2]))
    else:
        main(sys.argv[1])
