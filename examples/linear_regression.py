"""Linear regression with raw tensors and autograd (the Candle-vs-PyTorch comparison loop).

10 features -> 1 output, mean squared error, an Adam update written by hand.
Run: python examples/linear_regression.py
"""

import ember

ember.manual_seed(0)
true_w = ember.tensor([[1.5], [-2.0], [0.5], [3.0], [-1.0], [0.0], [2.5], [-0.5], [1.0], [-3.0]])
true_b = 0.7
x = ember.randn(1000, 10)
y = x @ true_w + true_b + 0.01 * ember.randn(1000, 1)

w = ember.zeros(10, 1, requires_grad=True)
b = ember.zeros(1, requires_grad=True)
params = [w, b]
m = [ember.zeros_like(p) for p in params]
v = [ember.zeros_like(p) for p in params]
lr, beta1, beta2, eps = 0.1, 0.9, 0.999, 1e-8

for step in range(1, 301):
    loss = ((x @ w + b - y) ** 2).mean()
    loss.backward()
    with ember.no_grad():
        for p, m_, v_ in zip(params, m, v):
            m_.mul_(beta1).add_(p.grad, alpha=1 - beta1)
            v_.mul_(beta2).add_(p.grad * p.grad, alpha=1 - beta2)
            m_hat = m_ / (1 - beta1**step)
            v_hat = v_ / (1 - beta2**step)
            p.sub_(lr * m_hat / (v_hat.sqrt() + eps))
            p.grad = None
    if step % 30 == 0 or step == 1:
        print(f"step {step:4d}  loss {loss.item():.6f}")

print("recovered w:", [round(v, 3) for v in w.detach().reshape(-1).tolist()])
print("true      w:", [round(v, 3) for v in true_w.reshape(-1).tolist()])
print(f"recovered b: {b.item():.3f}  (true {true_b})")
