"""Data-parallel training with the semi-CRF head: correctness across ranks and throughput scaling.

Two modes, one long-sequence workload (default: B = 8 sequences per GPU, T = 50,000, K = 64, the 3
labels and 6 features of :class:`~torch_semimarkov.data.SyntheticGenomicsDataset`, a
:class:`~torch_semimarkov.demo.CNNEncoder` with 32 channels and
``SemiMarkovCRFHead(..., boundary_scores=True)``):

``--mode ddp`` (default): ``mp.spawn`` starts ``--world-size`` processes (NCCL, one GPU each, when
CUDA has enough GPUs; else gloo on CPU; ``--backend`` forces one). Every rank builds the same model
(same seed) and the same global batch of ``world_size * B`` sequences, and takes its shard (rank r:
sequences ``[r*B, (r+1)*B)``); the loss is ``compute_loss(..., reduction="mean")`` (mean over the
sequences), so DDP's average over ranks of equal shards is the mean over the global batch.

* correctness: after one DDP forward/backward, the flattened gradients of all ranks are gathered
  (their largest difference must be exactly 0); rank 0 then computes, without DDP, the loss and the
  gradients of the same initial model on the whole global batch on its one device (in
  ``--reference-chunks`` equal chunks whose mean losses are averaged, which is the same function:
  1, the default, is one forward over all ``world_size * B`` sequences) and reports the difference
  of the loss (the DDP loss averaged over ranks) and of the gradients. After the timed steps the
  parameters of all ranks are compared again (exactly equal).
* throughput: ``--steps`` training steps (after ``--warmup``) of zero_grad, forward, backward and
  Adam step with DDP on all ranks (B per rank), each step started together (CUDA synchronize and a
  barrier) and ended by a CUDA synchronize; a step's time is its slowest rank's. Then rank 0 alone
  times the same steps without DDP on B sequences on its own GPU while the other ranks wait on a
  CPU barrier. Throughput is sequences per second from the median step time; the ratio of the
  ``world_size``-GPU throughput to the one-GPU throughput is the scaling (target: >= 0.9 *
  world_size, i.e. 1.8 on two GPUs).

``--mode lightning``: ``Trainer(devices=world_size, strategy="ddp")`` (``strategy="auto"`` for one
device) fits :class:`~torch_semimarkov.lightning.SemiCRFLightningModule` (which uses the
``token_mean`` loss) for ``warmup + steps`` steps on T-long sequences, B per device per step; a
callback times each step (``on_train_batch_start`` to ``on_train_batch_end``, CUDA-synchronized;
the batch is already on the device) and checks at the end of training that every rank holds the
same parameters. Lightning re-launches this script once per extra device, so only rank 0 writes
output. Run it once with ``--world-size 1`` and pass that JSON as ``--baseline`` to the
multi-device run to get the throughput ratio (the ddp mode measures the ratio in one run).

Usage (from the repository root; on the 2-GPU machine these are the defaults)::

    python benchmarks/bench_ddp.py --out bench_ddp.json                       # ddp mode, 2 ranks
    python benchmarks/bench_ddp.py --mode lightning --world-size 1 --out bench_ddp_pl1.json
    python benchmarks/bench_ddp.py --mode lightning --world-size 2 --baseline bench_ddp_pl1.json \\
        --out bench_ddp_pl2.json
    # CPU smoke test (gloo): --length 300 --batch-size 2 --steps 2 --warmup 1 --max-duration 8

The ddp mode exits with status 1 when the gradients (or parameters) differ across ranks or the
reference check exceeds ``--loss-rtol`` / ``--grad-rtol``; the throughput target is reported, not
enforced. NCCL multicast (NVLS) and symmetric-memory multicast are switched off unless the
environment already says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

# NVLink multicast must stay off on the GPU machine this runs on (set before NCCL is initialised)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

try:
    import torch_semimarkov  # noqa: F401,E402
except ImportError:  # run from a checkout without installing: use its src/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from torch_semimarkov.data import SyntheticGenomicsDataset, collate_segments  # noqa: E402
from torch_semimarkov.demo import CNNEncoder  # noqa: E402
from torch_semimarkov.nn import SemiMarkovCRFHead  # noqa: E402

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_ddp +{time.perf_counter() - _T0:7.1f} s] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("ddp", "lightning"), default="ddp")
    p.add_argument("--world-size", type=int, default=2, help="processes / devices (ignored under torchrun)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank (per GPU) and step")
    p.add_argument("--length", type=int, default=50_000, help="T, the length of every sequence")
    p.add_argument("--max-duration", type=int, default=64, help="K")
    p.add_argument("--hidden", type=int, default=32, help="encoder channels")
    p.add_argument("--steps", type=int, default=10, help="timed training steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps before them")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto", help="ddp mode: gloo, nccl or auto (nccl when CUDA has "
                   "world-size GPUs)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when it has world-size GPUs, else cpu")
    p.add_argument("--reference-chunks", type=int, default=1,
                   help="ddp mode: the one-device reference runs the global batch in this many equal chunks")
    p.add_argument("--no-validate", action="store_true", help="SemiMarkovCRFHead(validate=False): no host sync")
    p.add_argument("--loss-rtol", type=float, default=1e-4, help="ddp mode: allowed |loss_ddp - loss_ref| / |loss_ref|")
    p.add_argument("--grad-rtol", type=float, default=1e-3,
                   help="ddp mode: allowed max|g_ddp - g_ref| / max|g_ref|")
    p.add_argument("--target-ratio", type=float, default=None, help="throughput ratio target (default 0.9 * world size)")
    p.add_argument("--baseline", default=None, help="lightning mode: JSON of a --world-size 1 lightning run")
    p.add_argument("--out", default="bench_ddp.json")
    args = p.parse_args(argv)
    if args.world_size < 1 or args.batch_size < 1 or args.length < 1 or args.steps < 1 or args.warmup < 0:
        p.error("world-size, batch-size, length and steps must be >= 1, warmup >= 0")
    if args.reference_chunks < 1 or (args.world_size * args.batch_size) % args.reference_chunks:
        p.error("--reference-chunks must divide world-size * batch-size")
    if args.target_ratio is None:
        args.target_ratio = 0.9 * args.world_size
    return args


def use_cuda(args, world_size: int) -> bool:
    if args.device == "cpu" or (args.backend == "gloo" and args.device == "auto"):
        return False
    ok = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
    if args.device == "cuda" and not ok:
        raise SystemExit(f"--device cuda needs {world_size} GPU(s), found "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    return ok


def make_dataset(n: int, args) -> SyntheticGenomicsDataset:
    return SyntheticGenomicsDataset(n, args.length, args.length, seed=args.seed)


def make_batch(args, n: int):
    """The global batch: n sequences of exactly T positions (deterministic given the seed)."""
    data = make_dataset(n, args)
    return collate_segments([data[i] for i in range(n)]), data.num_features, data.num_classes


class Tagger(nn.Module):
    """CNN encoder + semi-CRF head whose ``forward`` returns the per-sequence mean NLL (as DDP needs)."""

    def __init__(self, num_features: int, num_classes: int, args):
        super().__init__()
        self.encoder = CNNEncoder(num_features, args.hidden)
        self.head = SemiMarkovCRFHead(num_classes, args.max_duration, hidden_dim=args.hidden, boundary_scores=True,
                                      validate=not args.no_validate)

    def forward(self, features, lengths, labels):
        return self.head.compute_loss(self.encoder(features), lengths, labels, reduction="mean")


def build_model(args, F: int, C: int, device) -> Tagger:
    torch.manual_seed(args.seed)  # the same initial weights on every rank and for every copy
    return Tagger(F, C, args).to(device)


def flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(times_s):
    return 1e3 * statistics.median(times_s)


# --------------------------------------------------------------------------------------------- ddp


def ddp_worker(rank: int, world_size: int, args, local_rank: Optional[int] = None) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = rank if local_rank is None else local_rank
    cuda = use_cuda(args, world_size)
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    timeout = datetime.timedelta(minutes=30)
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    # barriers and small metadata go through gloo on the CPU: a waiting rank does not spin on a GPU
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    say = log if rank == 0 else (lambda msg: None)
    try:
        B, W = args.batch_size, world_size
        say(f"mode ddp: backend {backend}, {W} rank(s), device {device.type}, B={B} per rank, T={args.length}, "
            f"K={args.max_duration}, hidden={args.hidden}, steps {args.warmup}+{args.steps}")
        t = time.perf_counter()
        batch, F, C = make_batch(args, W * B)
        say(f"generated the global batch ({W * B} x {args.length}) in {time.perf_counter() - t:.2f} s on each rank")
        shard = {k: v[rank * B:(rank + 1) * B].to(device) for k, v in batch.items()}
        inputs = (shard["features"], shard["lengths"], shard["labels"])
        info = dict(rank=rank, host=socket.gethostname(), device=str(device),
                    device_name=torch.cuda.get_device_name(device) if cuda else "cpu")
        infos = [None] * W
        dist.all_gather_object(infos, info, group=cpu_group)

        model = build_model(args, F, C, device)
        ddp = DDP(model, device_ids=[local_rank] if cuda else None)

        # ---- correctness: one DDP forward/backward from the initial weights
        say("correctness: one DDP forward/backward")
        loss = ddp(*inputs)
        loss.backward()
        sync(device)
        g = flat_grads(model)
        gathered = [torch.empty_like(g) for _ in range(W)]
        dist.all_gather(gathered, g)
        rank_grad_diff = max(float((x - gathered[0]).abs().max()) for x in gathered)
        loss_sum = loss.detach().clone().reshape(1).double()
        dist.all_reduce(loss_sum)
        loss_ddp = float(loss_sum) / W
        per_rank_losses = [None] * W
        dist.all_gather_object(per_rank_losses, float(loss.detach()), group=cpu_group)
        say(f"  grads across ranks: max |g_r - g_0| = {rank_grad_diff:.3e}; DDP loss (mean over ranks) {loss_ddp:.6f}")

        ref = None
        if rank == 0:
            n_chunks = args.reference_chunks
            say(f"  reference: the same model without DDP on the whole global batch ({W * B} sequences, "
                f"{n_chunks} chunk(s)) on {device}")
            refmodel = build_model(args, F, C, device)
            same_init = all(torch.equal(a, b) for a, b in zip(refmodel.parameters(), model.parameters()))
            full = {k: v.to(device) for k, v in batch.items()}
            size = W * B // n_chunks
            ref_loss = 0.0
            for i in range(n_chunks):
                part = [full[k][i * size:(i + 1) * size] for k in ("features", "lengths", "labels")]
                li = refmodel(*part)
                (li / n_chunks).backward()
                ref_loss += float(li.detach().double()) / n_chunks
            sync(device)
            gr = flat_grads(refmodel)
            gd = g.double() - gr.double()
            names = [n for n, _ in refmodel.named_parameters()]
            per_param = {}
            for (n, p), pd in zip(refmodel.named_parameters(), model.parameters()):
                d = (pd.grad.double() - p.grad.double()).abs().max()
                per_param[n] = dict(max_abs_diff=float(d), max_abs_ref=float(p.grad.double().abs().max()))
            worst = max(names, key=lambda n: per_param[n]["max_abs_diff"] / max(per_param[n]["max_abs_ref"], 1e-30))
            ref = dict(
                reference_chunks=n_chunks,
                reference_description=(f"one forward/backward over all {W * B} sequences" if n_chunks == 1 else
                                       f"{n_chunks} chunks of {size} sequences, mean losses averaged, gradients "
                                       "accumulated (the same function as one forward over all of them)"),
                initial_weights_identical=same_init,
                loss_single=ref_loss,
                loss_ddp_mean_over_ranks=loss_ddp,
                loss_ddp_per_rank=per_rank_losses,
                loss_abs_diff=abs(loss_ddp - ref_loss),
                loss_rel_diff=abs(loss_ddp - ref_loss) / max(abs(ref_loss), 1e-30),
                grad_max_abs_diff=float(gd.abs().max()),
                grad_max_abs_ref=float(gr.abs().max()),
                grad_max_rel_diff=float(gd.abs().max() / gr.double().abs().max().clamp_min(1e-30)),
                grad_worst_param=worst,
                grad_per_param=per_param,
            )
            say(f"  single-device loss {ref_loss:.6f}: |DDP - single| = {ref['loss_abs_diff']:.3e} "
                f"(relative {ref['loss_rel_diff']:.2e}); grads max |DDP - single| = {ref['grad_max_abs_diff']:.3e} "
                f"(relative to max |g| {ref['grad_max_rel_diff']:.2e}, worst {worst})")
            del refmodel, full
            if cuda:
                torch.cuda.empty_cache()
        dist.barrier(group=cpu_group)

        # ---- throughput with DDP
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)

        def train_step(net, optimizer):
            optimizer.zero_grad(set_to_none=True)
            step_loss = net(*inputs)
            step_loss.backward()
            optimizer.step()
            return step_loss

        say(f"timing {args.warmup} warm-up + {args.steps} DDP steps on {W} rank(s)")
        times = []
        for i in range(args.warmup + args.steps):
            sync(device)
            dist.barrier(group=cpu_group)
            t0 = time.perf_counter()
            train_step(ddp, opt)
            sync(device)
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times.append(dt)
            say(f"  DDP step {i + 1}/{args.warmup + args.steps} ({'timed' if i >= args.warmup else 'warm-up'}): "
                f"{1e3 * dt:.1f} ms on rank 0")
        all_times = [None] * W
        dist.all_gather_object(all_times, times, group=cpu_group)
        step_max = [max(ts[j] for ts in all_times) for j in range(args.steps)]

        # parameters after the timed steps: identical on every rank
        pf = flat_params(model)
        gathered = [torch.empty_like(pf) for _ in range(W)]
        dist.all_gather(gathered, pf)
        rank_param_diff = max(float((x - gathered[0]).abs().max()) for x in gathered)
        say(f"  parameters across ranks after {args.warmup + args.steps} steps: max diff {rank_param_diff:.3e}")

        # ---- throughput on one device: rank 0 alone, the others wait on the CPU barrier
        single_times = []
        if rank == 0:
            say(f"timing {args.warmup} warm-up + {args.steps} single-device steps (no DDP) on {device}, "
                f"B={B}, other ranks idle")
            single = build_model(args, F, C, device)
            sopt = torch.optim.Adam(single.parameters(), lr=args.lr)
            for i in range(args.warmup + args.steps):
                sync(device)
                t0 = time.perf_counter()
                train_step(single, sopt)
                sync(device)
                dt = time.perf_counter() - t0
                if i >= args.warmup:
                    single_times.append(dt)
                say(f"  single step {i + 1}/{args.warmup + args.steps} "
                    f"({'timed' if i >= args.warmup else 'warm-up'}): {1e3 * dt:.1f} ms")
        dist.barrier(group=cpu_group)

        if rank == 0:
            ddp_ms = median_ms(step_max)
            single_ms = median_ms(single_times)
            ddp_tput = W * B / (ddp_ms / 1e3)
            single_tput = B / (single_ms / 1e3)
            ratio = ddp_tput / single_tput
            checks = dict(
                grads_identical_across_ranks=rank_grad_diff == 0.0,
                params_identical_across_ranks=rank_param_diff == 0.0,
                loss_matches_single_device=ref["loss_rel_diff"] <= args.loss_rtol,
                grads_match_single_device=ref["grad_max_rel_diff"] <= args.grad_rtol,
            )
            result = dict(
                mode="ddp",
                ok=all(checks.values()),
                checks=checks,
                config=_config(args, W, backend, device),
                environment=_environment(infos),
                correctness=dict(grad_max_abs_diff_across_ranks=rank_grad_diff,
                                 param_max_abs_diff_across_ranks_after_training=rank_param_diff, **ref),
                timing=dict(
                    ddp_step_ms_median=ddp_ms,
                    ddp_step_ms_per_step_max_over_ranks=[1e3 * x for x in step_max],
                    ddp_step_ms_median_per_rank=[median_ms(ts) for ts in all_times],
                    single_step_ms_median=single_ms,
                    single_step_ms=[1e3 * x for x in single_times],
                    ddp_sequences_per_s=ddp_tput,
                    single_sequences_per_s=single_tput,
                    ddp_positions_per_s=ddp_tput * args.length,
                    single_positions_per_s=single_tput * args.length,
                    throughput_ratio=ratio,
                    scaling_efficiency=ratio / W,
                    target_ratio=args.target_ratio,
                    meets_target=ratio >= args.target_ratio,
                ),
            )
            _write(args.out, result)
            print(_summary_ddp(result), flush=True)
    finally:
        # leave together: a rank that tears the group down while another is in a collective aborts it
        try:
            dist.barrier(group=cpu_group)
        finally:
            _quiesce_and_destroy()


def _quiesce_and_destroy() -> None:
    """Destroy the process groups once gloo's worker threads are idle.

    A gloo worker thread releases a finished collective (and the tensors it holds, which needs the
    GIL) shortly after ``wait()`` has returned. Destroying the group joins that thread while holding
    the GIL, so if it happens in that window the process hangs at exit (seen about 1 run in 8 with
    torch 2.13 on CPU). Sleeping releases the GIL and lets the threads finish first.
    """
    time.sleep(0.5)
    dist.destroy_process_group()


def _config(args, world_size, backend, device):
    return dict(world_size=world_size, backend=backend, device_type=device.type if device is not None else None,
                batch_per_rank=args.batch_size, global_batch=world_size * args.batch_size, length=args.length,
                max_duration=args.max_duration, num_classes=3, num_features=6, hidden=args.hidden,
                encoder="CNNEncoder", head="SemiMarkovCRFHead(boundary_scores=True, validate=%s)" % (not args.no_validate),
                steps=args.steps, warmup=args.warmup, lr=args.lr, seed=args.seed, optimizer="Adam")


def _environment(infos=None):
    nccl = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
        except Exception:  # noqa: BLE001 - informational only
            pass
    env = dict(torch=torch.__version__, python=sys.version.split()[0], cuda=torch.version.cuda, nccl=nccl,
               NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"),
               TORCH_SYMM_MEM_DISABLE_MULTICAST=os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"))
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - optional
        env["triton"] = None
    if infos is not None:
        env["ranks"] = infos
    return env


def _write(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    log(f"wrote {path}")


def _summary_ddp(r):
    c, cor, t = r["config"], r["correctness"], r["timing"]
    names = sorted({x["device_name"] for x in r["environment"]["ranks"]})
    lines = [
        "",
        f"== bench_ddp (ddp mode): {c['world_size']} x {', '.join(names)} ({c['backend']}), torch {r['environment']['torch']}",
        f"   workload: B={c['batch_per_rank']} per rank (global {c['global_batch']}), T={c['length']}, "
        f"K={c['max_duration']}, C={c['num_classes']}, hidden={c['hidden']}",
        f"   grads across ranks after all-reduce: max diff {cor['grad_max_abs_diff_across_ranks']:.3e} "
        f"({'identical' if r['checks']['grads_identical_across_ranks'] else 'DIFFERENT'}); parameters after "
        f"training: max diff {cor['param_max_abs_diff_across_ranks_after_training']:.3e}",
        f"   loss: DDP mean over ranks {cor['loss_ddp_mean_over_ranks']:.6f}, single device {cor['loss_single']:.6f} "
        f"({cor['reference_description']}): abs diff {cor['loss_abs_diff']:.3e}, rel {cor['loss_rel_diff']:.2e}",
        f"   grads DDP vs single device: max abs diff {cor['grad_max_abs_diff']:.3e} (max |g| "
        f"{cor['grad_max_abs_ref']:.3e}, relative {cor['grad_max_rel_diff']:.2e})",
        f"   step (median of {c['steps']}): {c['world_size']} ranks {t['ddp_step_ms_median']:.1f} ms, one device "
        f"{t['single_step_ms_median']:.1f} ms",
        f"   throughput: {t['ddp_sequences_per_s']:.2f} seq/s on {c['world_size']} vs {t['single_sequences_per_s']:.2f} "
        f"seq/s on 1: ratio {t['throughput_ratio']:.3f} (target >= {t['target_ratio']:.2f}: "
        f"{'met' if t['meets_target'] else 'NOT met'}; efficiency {100 * t['scaling_efficiency']:.1f} %)",
        f"   correctness checks: {'all passed' if r['ok'] else 'FAILED ' + str([k for k, v in r['checks'].items() if not v])}",
    ]
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(args) -> int:
    import torch.multiprocessing as mp

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        ddp_worker(rank, world, args, int(os.environ.get("LOCAL_RANK", rank)))
        if rank != 0:
            return 0
    else:
        if os.path.exists(args.out):
            os.remove(args.out)  # so that a stale file cannot pass for this run's result
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        mp.spawn(ddp_worker, args=(args.world_size, args), nprocs=args.world_size, join=True)
    with open(args.out) as f:
        ok = json.load(f)["ok"]
    return 0 if ok else 1


# --------------------------------------------------------------------------------------- lightning


def run_lightning(args) -> int:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from torch_semimarkov.lightning import SemiCRFLightningModule

    W = args.world_size
    cuda = use_cuda(args, W)
    if not cuda:
        torch.set_num_threads(1)
    n_steps = args.warmup + args.steps

    class StepTimer(pl.Callback):
        """Per-step wall time (batch already on the device) and the cross-rank parameter check."""

        def __init__(self):
            self.starts, self.times, self.result = [], [], {}

        def _sync(self, pl_module):
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize(pl_module.device)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._sync(pl_module)
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._sync(pl_module)
            self.times.append(time.perf_counter() - self.starts[-1])
            if trainer.global_rank == 0:
                i = len(self.times)
                log(f"  step {i}/{n_steps} ({'timed' if i > args.warmup else 'warm-up'}): "
                    f"{1e3 * self.times[-1]:.1f} ms on rank 0")

        def on_train_end(self, trainer, pl_module):
            flat = flat_params(pl_module)
            times = torch.tensor(self.times, dtype=torch.float64, device=pl_module.device)
            if trainer.world_size > 1:
                params = trainer.strategy.all_gather(flat)  # (W, N)
                times = trainer.strategy.all_gather(times)  # (W, steps)
            else:
                params, times = flat[None], times[None]
            self.result = dict(
                param_max_abs_diff_across_ranks=float((params - params[0:1]).abs().max()),
                step_s_per_rank=times.cpu().tolist(),
            )

    n_seq = W * args.batch_size * n_steps
    data = make_dataset(n_seq, args)
    # generated once and cycled: the synthetic sequences are made on the host (~20 ms per sequence at
    # T = 50,000), which would otherwise sit inside the steps of whichever rank waits for the other
    pool = [data[i] for i in range(min(n_seq, 2 * W * args.batch_size))]

    class Cycled(torch.utils.data.Dataset):
        def __len__(self):
            return n_seq

        def __getitem__(self, i):
            return pool[i % len(pool)]

    loader = DataLoader(Cycled(), batch_size=args.batch_size, shuffle=False, collate_fn=collate_segments,
                        num_workers=0)
    torch.manual_seed(args.seed)
    module = SemiCRFLightningModule(
        CNNEncoder(data.num_features, args.hidden),
        SemiMarkovCRFHead(data.num_classes, args.max_duration, hidden_dim=args.hidden, boundary_scores=True,
                          validate=not args.no_validate),
        lr=args.lr,
    )
    timer = StepTimer()
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=W, strategy="ddp" if W > 1 else "auto", max_steps=n_steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[timer], default_root_dir=os.environ.get("TMPDIR", "/tmp"),
    )
    if trainer.global_rank == 0:
        log(f"mode lightning: {W} {'GPU' if cuda else 'CPU'} device(s), strategy {'ddp' if W > 1 else 'auto'}, "
            f"B={args.batch_size} per device, T={args.length}, K={args.max_duration}, steps {args.warmup}+{args.steps} "
            f"({n_seq} sequences, generated lazily by the loader)")
    trainer.fit(module, loader)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        _quiesce_and_destroy()  # see there: tear down now rather than at interpreter exit
    if trainer.global_rank != 0:
        return 0
    r = timer.result
    per_rank = r["step_s_per_rank"]
    if len(per_rank[0]) < n_steps:
        raise RuntimeError(f"only {len(per_rank[0])} of {n_steps} steps ran (too few sequences?)")
    step_max = [max(ts[j] for ts in per_rank) for j in range(args.warmup, n_steps)]
    step_ms = median_ms(step_max)
    tput = W * args.batch_size / (step_ms / 1e3)
    timing = dict(
        step_ms_median=step_ms,
        step_ms_per_step_max_over_ranks=[1e3 * x for x in step_max],
        step_ms_median_per_rank=[median_ms(ts[args.warmup:]) for ts in per_rank],
        sequences_per_s=tput,
        positions_per_s=tput * args.length,
    )
    if args.baseline:
        with open(args.baseline) as f:
            base = json.load(f)
        bt = base["timing"]["sequences_per_s"]
        bc = base["config"]
        same = all(bc.get(k) == v for k, v in dict(batch_per_rank=args.batch_size, length=args.length,
                                                     max_duration=args.max_duration, hidden=args.hidden).items())
        timing.update(baseline_file=args.baseline, baseline_world_size=bc["world_size"], baseline_sequences_per_s=bt,
                      baseline_same_workload=same, throughput_ratio=tput / bt,
                      scaling_efficiency=tput / bt / (W / bc["world_size"]),
                      target_ratio=args.target_ratio, meets_target=tput / bt >= args.target_ratio)
    checks = dict(params_identical_across_ranks=r["param_max_abs_diff_across_ranks"] == 0.0)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    config = _config(args, W, "nccl" if (cuda and W > 1) else ("gloo" if W > 1 else None), device)
    config.update(strategy="ddp" if W > 1 else "auto", module="SemiCRFLightningModule (token_mean loss)",
                  lightning=pl.__version__ if hasattr(pl, "__version__") else None)
    env = _environment()
    env["device_names"] = [torch.cuda.get_device_name(i) for i in range(W)] if cuda else ["cpu"] * W
    result = dict(mode="lightning", ok=all(checks.values()), checks=checks, config=config, environment=env,
                  correctness=dict(param_max_abs_diff_across_ranks=r["param_max_abs_diff_across_ranks"]),
                  timing=timing)
    _write(args.out, result)
    lines = [
        "",
        f"== bench_ddp (lightning mode): Trainer(devices={W}, strategy={config['strategy']!r}) on "
        f"{', '.join(sorted(set(env['device_names'])))}, torch {env['torch']}, lightning {config['lightning']}",
        f"   workload: B={args.batch_size} per device, T={args.length}, K={args.max_duration}, hidden={args.hidden}",
        f"   parameters across ranks after {n_steps} steps: max diff {r['param_max_abs_diff_across_ranks']:.3e}",
        f"   step (median of {args.steps}): {step_ms:.1f} ms; throughput {tput:.2f} seq/s",
    ]
    if args.baseline:
        lines.append(f"   vs {timing['baseline_world_size']} device(s) ({args.baseline}): {bt:.2f} seq/s, ratio "
                     f"{timing['throughput_ratio']:.3f} (target >= {args.target_ratio:.2f}: "
                     f"{'met' if timing['meets_target'] else 'NOT met'})"
                     + ("" if timing["baseline_same_workload"] else " [baseline has a DIFFERENT workload]"))
    print("\n".join(lines), flush=True)
    return 0 if result["ok"] else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mode == "lightning":
        return run_lightning(args)
    return run_ddp(args)


if __name__ == "__main__":
    sys.exit(main())
