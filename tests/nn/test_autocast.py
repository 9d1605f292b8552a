"""Mixed precision: the head under ``torch.autocast`` (float16 and bfloat16) with every option,
on the CPU and, when present, CUDA: the loss within 1e-2 relative of float32, finite gradients."""

import itertools

import pytest
import torch

from torch_semimarkov import SemiMarkovCRFHead

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
OPTIONS = [
    dict(boundary_scores=bs, start_end_scores=se, transition=tr, duration=dur)
    for bs, se, tr, dur in itertools.product([False, True], [False, True], ["static", "duration"],
                                             ["learned", "poisson"])
] + [dict(allowed_transitions=torch.tensor([[True, True, False], [False, True, True], [True, False, True]])),
     dict(cumsum_dtype=torch.float64, boundary_scores=True)]


def _ids(o):
    return "-".join(f"{k}={v}" for k, v in o.items() if k != "allowed_transitions") or "allowed_transitions"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("options", OPTIONS, ids=[_ids(o) for o in OPTIONS])
def test_autocast_loss_close_to_float32_with_finite_gradients(options, dtype, device):
    torch.manual_seed(0)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=8, **options).to(device)
    enc = torch.nn.Linear(6, 8).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 15, 6, generator=g).to(device)
    lengths = torch.tensor([15, 9, 4], device=device)
    labels = torch.zeros(3, 15, dtype=torch.long)
    labels[:, 5:] = 1
    labels[:, 10:] = 2
    labels[1, 9:] = -100
    labels[2, 4:] = -100
    labels = labels.to(device)
    ref = head.compute_loss(enc(x), lengths, labels)
    with torch.autocast(device, dtype=dtype):
        loss = head.compute_loss(enc(x), lengths, labels)
        # decoding and posteriors under autocast too
        head.decode(enc(x), lengths)
        head.marginals(enc(x), lengths)
    assert loss.dtype == head.cumsum_dtype
    assert abs(loss.item() - ref.item()) <= 1e-2 * abs(ref.item())
    loss.backward()
    grads = [p.grad for p in list(head.parameters()) + list(enc.parameters()) if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
