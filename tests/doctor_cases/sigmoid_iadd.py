"""`+=` on the output of sigmoid, which sigmoid saved for its backward."""
import torch

logits = torch.randn(4, 10, requires_grad=True)
probs = torch.sigmoid(logits)  # doctor: saved aten::sigmoid
probs += 1e-6  # doctor: modified aten::add_
loss = -probs.log().mean()
loss.backward()
