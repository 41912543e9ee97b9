"""A ThreadPoolExecutor worker standardises rows of a tensor that sigmoid saved for backward."""
# doctor-thread: ThreadPoolExecutor
from concurrent.futures import ThreadPoolExecutor

import torch

torch.manual_seed(0)
logits = torch.randn(4, 6, requires_grad=True)
probs = logits.sigmoid()  # doctor: saved aten::sigmoid


def standardise(row: int) -> None:
    with torch.no_grad():
        probs[row].sub_(probs[row].mean())  # doctor: modified aten::sub_


with ThreadPoolExecutor(max_workers=2) as pool:
    list(pool.map(standardise, range(4)))
probs.pow(2).sum().backward()
