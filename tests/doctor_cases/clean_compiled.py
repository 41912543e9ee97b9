"""Training a torch.compile'd model with the eager and aot_eager backends: nothing to report, no recompiles."""
import torch
from torch import nn

torch.manual_seed(0)
for backend in ("eager", "aot_eager"):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(12):
        loss = compiled(torch.randn(4 + step % 3, 4)).sigmoid().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
