"""A word-level LSTM language model whose repackage() unpacks (h, c), detaches h and passes c on with its graph."""
import torch
from torch import nn


class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.decoder = nn.Linear(16, 20)

    def forward(self, tokens, hidden):
        out, hidden = self.lstm(self.embed(tokens), hidden)  # doctor: carried
        return self.decoder(out), hidden


def repackage(hidden):
    h, c = hidden
    return h.detach(), c  # doctor: produced


torch.manual_seed(0)
model = LanguageModel()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
for step in range(3):
    tokens = torch.randint(0, 20, (4, 6))
    hidden = repackage(hidden)  # doctor: passed
    logits, hidden = model(tokens, hidden)
    loss = nn.functional.cross_entropy(logits.reshape(-1, 20), tokens.reshape(-1))
    opt.zero_grad()
    loss.backward()  # doctor: freed failed
    opt.step()
