"""Train an encoder + SemiMarkovCRFHead with DistributedDataParallel.

Runs on CPUs with the gloo backend (or on GPUs with NCCL, one process per GPU). Either let this
script spawn its workers:

    python examples/train_ddp.py --world-size 2 --epochs 2

or start it with torchrun, which sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT:

    torchrun --nproc_per_node 2 examples/train_ddp.py --epochs 2

Each rank reads its own shard of the synthetic data (DistributedSampler); DDP averages gradients,
so every rank ends with the same parameters, which the script checks at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from torch_semimarkov.data import SyntheticGenomicsDataset, collate_segments
from torch_semimarkov.demo import CNNEncoder
from torch_semimarkov.nn import SemiMarkovCRFHead


class Tagger(nn.Module):
    """Encoder + head whose ``forward`` returns the loss, as DDP needs."""

    def __init__(self, num_features: int, num_classes: int, max_duration: int, hidden: int):
        super().__init__()
        self.encoder = CNNEncoder(num_features, hidden)
        self.head = SemiMarkovCRFHead(num_classes, max_duration, hidden_dim=hidden, boundary_scores=True)

    def forward(self, features, lengths, labels):
        return self.head.compute_loss(self.encoder(features), lengths, labels, reduction="token_mean")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--num-sequences", type=int, default=64)
    p.add_argument("--min-length", type=int, default=100)
    p.add_argument("--max-length", type=int, default=200)
    p.add_argument("--max-duration", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--backend", default="auto", help="gloo, nccl or auto (nccl when CUDA is available)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def worker(rank: int, world_size: int, args) -> None:
    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
            torch.set_num_threads(1)
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        data = SyntheticGenomicsDataset(args.num_sequences, args.min_length, args.max_length, seed=args.seed)
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, collate_fn=collate_segments)
        model = Tagger(data.num_features, data.num_classes, args.max_duration, args.hidden).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            total = torch.zeros(2, device=device)
            for batch in loader:
                batch = {k: v.to(device) for k, v in batch.items()}
                opt.zero_grad(set_to_none=True)
                loss = ddp(batch["features"], batch["lengths"], batch["labels"])
                loss.backward()
                opt.step()
                total += torch.stack([loss.detach(), torch.ones((), device=device)])
            dist.all_reduce(total)
            if rank == 0:
                print(f"epoch {epoch + 1}/{args.epochs}: mean loss over {world_size} ranks {float(total[0] / total[1]):.4f}", flush=True)
        # every rank must hold the same parameters after DDP's gradient averaging
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(gathered, flat)
        max_diff = max(float((g - flat).abs().max()) for g in gathered)
        in_sync = max_diff < 1e-5
        if rank == 0:
            print(f"parameters in sync across {world_size} ranks: {in_sync} (max diff {max_diff:.2e})", flush=True)
        if not in_sync:
            raise RuntimeError(f"rank {rank}: parameters differ across ranks by {max_diff}")
    finally:
        # every rank leaves together: a rank that tears gloo down while another is still in a
        # collective can abort the other ("terminate called without an active exception")
        try:
            dist.barrier()
        finally:
            # destroying a gloo group joins its worker threads, which may need the GIL this thread
            # holds (torch 2.13 hung at exit about 1 run in 8 without this); sleeping releases it
            time.sleep(0.5)
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    mp.spawn(worker, args=(args.world_size, args), nprocs=args.world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
