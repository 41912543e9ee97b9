"""A GRU sequence tagger over a long stream in windows; the loop passes the returned state back into the next window."""
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x, state):
        out, state = self.gru(x, state)  # doctor: carried
        return self.head(out), state


torch.manual_seed(0)
tagger = Tagger()
opt = torch.optim.Adam(tagger.parameters(), lr=1e-3)
stream, tags = torch.randn(2, 60, 5), torch.randint(0, 3, (2, 60))
state = torch.zeros(1, 2, 16)
for start in range(0, 60, 20):
    window, window_tags = stream[:, start : start + 20], tags[:, start : start + 20]
    logits, state = tagger(window, state)  # doctor: passed
    loss = nn.functional.cross_entropy(logits.transpose(1, 2), window_tags)
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
