"""Linear regression with nn.Linear, AdamW and mse_loss: the PyTorch loop, line for line.

10 features -> 1 output. Swap `ember` for `torch` below and it runs under PyTorch unchanged.
Run: python examples/linear_regression.py
"""

import ember
import ember.nn.functional as F
from ember import nn, optim

ember.manual_seed(0)
true_w = ember.tensor([[1.5, -2.0, 0.5, 3.0, -1.0, 0.0, 2.5, -0.5, 1.0, -3.0]])
true_b = 0.7
x = ember.randn(1000, 10)
y = x @ true_w.T + true_b + 0.01 * ember.randn(1000, 1)

model = nn.Linear(10, 1)
optimizer = optim.AdamW(model.parameters(), lr=0.1, weight_decay=1e-4)

for step in range(1, 301):
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 30 == 0 or step == 1:
        print(f"step {step:4d}  loss {loss.item():.6f}")

print("recovered w:", [round(v, 3) for v in model.weight.detach().reshape(-1).tolist()])
print("true      w:", [round(v, 3) for v in true_w.reshape(-1).tolist()])
print(f"recovered b: {model.bias.item():.3f}  (true {true_b})")
