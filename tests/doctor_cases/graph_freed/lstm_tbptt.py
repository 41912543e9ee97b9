"""A character-level language model trained with truncated BPTT; the (h, c) state is passed on as is."""
# doctor-fix: detach
import torch
from torch import nn

torch.manual_seed(0)
embed = nn.Embedding(20, 8)
lstm = nn.LSTM(8, 16, batch_first=True)
decoder = nn.Linear(16, 20)
params = [*embed.parameters(), *lstm.parameters(), *decoder.parameters()]
opt = torch.optim.SGD(params, lr=0.1)
text = torch.randint(0, 20, (2, 31))
h, c = torch.zeros(1, 2, 16), torch.zeros(1, 2, 16)
for start in range(0, 30, 10):
    chunk, target = text[:, start : start + 10], text[:, start + 1 : start + 11]
    out, (h, c) = lstm(embed(chunk), (h, c))  # doctor: carried
    loss = nn.functional.cross_entropy(decoder(out).flatten(0, 1), target.flatten())
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
