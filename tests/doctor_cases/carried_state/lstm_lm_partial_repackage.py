"""Truncated-BPTT LSTM language model; repackage_hidden() detaches h and passes c on with its graph."""
import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, tokens, width):
        super().__init__()
        self.encoder = nn.Embedding(tokens, width)
        self.rnn = nn.LSTM(width, width, num_layers=2, dropout=0.1)
        self.decoder = nn.Linear(width, tokens)

    def forward(self, source, hidden):
        output, hidden = self.rnn(self.encoder(source), hidden)  # doctor: carried
        return self.decoder(output), hidden

    def init_hidden(self, batch):
        return torch.zeros(2, batch, self.rnn.hidden_size), torch.zeros(2, batch, self.rnn.hidden_size)


def batchify(stream, batch):
    columns = stream.numel() // batch
    return stream[: columns * batch].view(batch, columns).t().contiguous()


def get_batch(source, i, bptt):
    length = min(bptt, len(source) - 1 - i)
    return source[i : i + length], source[i + 1 : i + 1 + length].reshape(-1)


def repackage_hidden(h):
    return h[0].detach(), h[1]  # doctor: produced


torch.manual_seed(0)
corpus = batchify(torch.randint(0, 30, (400,)), 4)
model = RNNModel(30, 12)
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
hidden = model.init_hidden(4)
for i in range(0, 3 * 7, 7):
    data, targets = get_batch(corpus, i, 7)
    hidden = repackage_hidden(hidden)  # doctor: passed
    optimizer.zero_grad()
    output, hidden = model(data, hidden)
    loss = nn.functional.cross_entropy(output.view(-1, 30), targets)
    loss.backward()  # doctor: freed failed
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
