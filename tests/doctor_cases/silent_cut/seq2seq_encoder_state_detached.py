"""A GRU encoder-decoder whose encoder state is detached before decoding (to save memory), so the encoder never trains."""
import torch
from torch import nn

torch.manual_seed(0)
embedding = nn.Embedding(20, 8)
encoder, decoder = nn.GRU(8, 16, batch_first=True), nn.GRU(8, 16, batch_first=True)
readout = nn.Linear(16, 20)
modules = (embedding, encoder, decoder, readout)
opt = torch.optim.Adam([p for module in modules for p in module.parameters()], lr=1e-3)
for _step in range(3):
    source, target = torch.randint(0, 20, (4, 7)), torch.randint(0, 20, (4, 6))
    _, hidden = encoder(embedding(source))
    hidden = hidden.detach()  # doctor: cut
    output, _ = decoder(embedding(target[:, :-1]), hidden)
    loss = nn.functional.cross_entropy(readout(output).transpose(1, 2), target[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
