#!/usr/bin/python3
"""adafactor_ref.py — the reference for tests/test_adafactor.c.

Debian's PyTorch (1.13) has no torch.optim.Adafactor (it came in 2.5), so
this script writes the step twice from the equations:

  1. torch float32: PyTorch 2.5's _single_tensor_adafactor
     (torch/optim/_adafactor.py) transcribed line by line with the same
     tensor operations (lerp_, torch.norm(dim=..., keepdim=True).square_(),
     row_var @ col_var, mean, clamp_, rsqrt_, .norm(2).item(), add_ with a
     Python-float alpha), so every float32 rounding is PyTorch's;
  2. float64 NumPy: the same equations (Shazeer & Stern 2018, with
     PyTorch's choices: decay 1 - t^beta2_decay, relative step
     min(lr, 1/sqrt(t)) max(eps2, RMS(p)), update clipping max(1, RMS(U)/d),
     decoupled weight decay p *= 1 - lr wd before the update, RMS(p) taken
     before it).

With beta1 > 0 both add Hugging Face's first moment (transformers'
Adafactor): u = U / max(1, RMS(U)/d) * alpha; m = beta1 m + (1 - beta1) u;
p -= m. Each case runs 5 steps on fixed parameters and gradients and dumps
the parameter and the state (row_var then col_var flattened, or variance;
then exp_avg) after every step, as tests/adafactor_ref.h:

    /usr/bin/python3 tests/ref/adafactor_ref.py > tests/adafactor_ref.h
"""
import math

import numpy as np
import torch

STEPS = 5
EPS32 = float(torch.finfo(torch.float32).eps)

# name, shape, options (lr, beta2_decay, eps1 (None: float32's eps), eps2, d,
# weight_decay, beta1), what the case exercises
CASES = [
    ("matrix", (7, 13), dict(), "defaults; row 2's gradient is always 0"),
    ("batched", (3, 4, 5), dict(weight_decay=0.1), "leading dim batched, weight decay"),
    ("vector", (11,), dict(weight_decay=0.1), "a vector's variance, weight decay"),
    ("relative", (7, 13), dict(lr=0.8), "lr 0.8: rho = 1/sqrt(t) from step 2"),
    ("small_lr", (6, 9), dict(lr=1e-3), "lr 1e-3 caps rho"),
    ("options", (5, 8), dict(beta2_decay=-0.5, eps2=1e-2, d=0.5, eps1=1e-6), "other options"),
    ("zero_param", (4, 6), dict(), "p = 0: alpha = eps2 rho"),
    ("beta1", (7, 13), dict(beta1=0.9, weight_decay=0.05), "HF's first moment"),
    ("beta1_vec", (9,), dict(beta1=0.8), "HF's first moment on a vector"),
]


def opts(o):
    d = dict(lr=1e-2, beta2_decay=-0.8, eps1=None, eps2=1e-3, d=1.0, weight_decay=0.0, beta1=0.0)
    d.update(o)
    return d


def start(name, shape):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.float64)
    if name == "zero_param":
        p = np.zeros(n)
    else:
        p = np.round(np.sin(i * 0.37 + 0.3) * 1.7 + 0.05 * (i % 5), 4)
    g = []
    for t in range(STEPS):
        x = np.round(np.cos(i * 0.53 + t * 1.1) * (0.3 + 0.2 * t) + 0.01 * ((i * 7 + t) % 11 - 5), 5)
        if name == "matrix":
            x.reshape(shape)[2, :] = 0.0
        g.append(x)
    p = torch.tensor(p, dtype=torch.float32).reshape(shape)
    g = [torch.tensor(x, dtype=torch.float32).reshape(shape) for x in g]
    return p, g


def step_torch(p, grad, st, t, o):
    """_single_tensor_adafactor (PyTorch 2.5) on float32 tensors, plus HF's beta1."""
    eps1 = o["eps1"] if o["eps1"] is not None else EPS32
    step_float = float(t)
    one_minus_beta2_t = step_float ** o["beta2_decay"]
    rho_t = min(o["lr"], 1 / (step_float ** 0.5))
    alpha = max(o["eps2"], p.norm(2).item() / (p.numel() ** 0.5)) * rho_t
    if o["weight_decay"] != 0:
        p.mul_(1 - o["lr"] * o["weight_decay"])
    if grad.dim() > 1:
        row_mean = torch.norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1))
        st["row_var"].lerp_(row_mean, one_minus_beta2_t)
        col_mean = torch.norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2))
        st["col_var"].lerp_(col_mean, one_minus_beta2_t)
        var_estimate = st["row_var"] @ st["col_var"]
        var_estimate.div_(st["row_var"].mean(dim=-2, keepdim=True).clamp_(min=eps1))
    else:
        grad_squared = grad * grad
        st["variance"].lerp_(grad_squared, one_minus_beta2_t)
        var_estimate = st["variance"].clone()
    update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
    update.mul_(grad)
    denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * o["d"]))
    if o["beta1"] != 0:
        update.div_(denom).mul_(alpha)
        st["exp_avg"].mul_(o["beta1"]).add_(update, alpha=1 - o["beta1"])
        p.sub_(st["exp_avg"])
    else:
        p.add_(update, alpha=-alpha / denom)


def step_f64(p, g, st, t, o):
    eps1 = o["eps1"] if o["eps1"] is not None else EPS32
    w = t ** o["beta2_decay"]
    rho = min(o["lr"], 1 / math.sqrt(t))
    alpha = max(o["eps2"], math.sqrt(np.mean(p * p))) * rho
    p *= 1 - o["lr"] * o["weight_decay"]
    if g.ndim > 1:
        st["row_var"] += w * (np.mean(g * g, axis=-1, keepdims=True) - st["row_var"])
        st["col_var"] += w * (np.mean(g * g, axis=-2, keepdims=True) - st["col_var"])
        v = st["row_var"] * st["col_var"] / np.maximum(np.mean(st["row_var"], axis=-2, keepdims=True), eps1)
    else:
        st["variance"] += w * (g * g - st["variance"])
        v = st["variance"]
    u = g / np.sqrt(np.maximum(v, eps1 * eps1))
    denom = max(1.0, math.sqrt(np.mean(u * u)) / o["d"])
    if o["beta1"] != 0:
        st["exp_avg"] *= o["beta1"]
        st["exp_avg"] += (1 - o["beta1"]) * (u / denom * alpha)
        p -= st["exp_avg"]
    else:
        p -= alpha / denom * u


def new_state(p, o, lib):
    zeros = torch.zeros if lib == "torch" else np.zeros
    kw = dict(dtype=torch.float32) if lib == "torch" else {}
    shape = tuple(p.shape)
    st = {}
    if len(shape) > 1:
        st["row_var"] = zeros(shape[:-1] + (1,), **kw)
        st["col_var"] = zeros(shape[:-2] + (1, shape[-1]), **kw)
    else:
        st["variance"] = zeros(shape, **kw)
    if o["beta1"] != 0:
        st["exp_avg"] = zeros(shape, **kw)
    return st


def flat(st, lib):
    parts = [st[k] for k in ("row_var", "col_var", "variance", "exp_avg") if k in st]
    if lib == "torch":
        return [float(x) for q in parts for x in q.flatten().tolist()]
    return [float(x) for q in parts for x in q.flatten()]


def cf(x):
    x = float(np.float32(x))
    if x == 0:
        return "0.0f"
    return "%.9gf" % x


def cd(x):
    return repr(float(x))


def arr(vals, fmt):
    return "{" + ", ".join(fmt(v) for v in vals) + "}"


def main():
    out = []
    out.append("/* adafactor_ref.h — generated by tests/ref/adafactor_ref.py with PyTorch %s and\n"
               " * NumPy %s (torch.optim.Adafactor's _single_tensor_adafactor transcribed in\n"
               " * float32 torch ops, and in float64):\n"
               " *   /usr/bin/python3 tests/ref/adafactor_ref.py > tests/adafactor_ref.h */\n"
               % (torch.__version__, np.__version__))
    out.append("#define ADAFACTOR_REF_STEPS %d\n" % STEPS)
    out.append("typedef struct adafactor_ref_case {\n"
               "    const char *name, *what;\n"
               "    int ndim;\n"
               "    int64_t shape[3];\n"
               "    double lr, beta2_decay, eps1, eps2, d, weight_decay, beta1; /* eps1 0: None */\n"
               "    int n, ns;                      /* elements, state floats */\n"
               "    const float *p0, *grads;        /* (n), (steps, n) */\n"
               "    const float *p32, *s32;         /* torch float32 after each step */\n"
               "    const double *p64, *s64;        /* float64 after each step */\n"
               "} adafactor_ref_case;\n")
    rows = []
    for name, shape, o_, what in CASES:
        o = opts(o_)
        p, g = start(name, shape)
        p0 = p.flatten().tolist()
        pt = p.clone()
        st = new_state(pt, o, "torch")
        p64 = p.double().numpy().copy()
        st64 = new_state(p64, o, "np")
        P32, S32, P64, S64 = [], [], [], []
        for t in range(1, STEPS + 1):
            step_torch(pt, g[t - 1], st, t, o)
            step_f64(p64, g[t - 1].double().numpy(), st64, t, o)
            P32 += pt.flatten().tolist()
            S32 += flat(st, "torch")
            P64 += [float(x) for x in p64.flatten()]
            S64 += flat(st64, "np")
        n = len(p0)
        ns = len(S32) // STEPS
        c = "ar_" + name
        out.append("static const float %s_p0[] = %s;\n" % (c, arr(p0, cf)))
        out.append("static const float %s_g[] = %s;\n" % (c, arr([x for q in g for x in q.flatten().tolist()], cf)))
        out.append("static const float %s_p32[] = %s;\n" % (c, arr(P32, cf)))
        out.append("static const float %s_s32[] = %s;\n" % (c, arr(S32, cf)))
        out.append("static const double %s_p64[] = %s;\n" % (c, arr(P64, cd)))
        out.append("static const double %s_s64[] = %s;\n" % (c, arr(S64, cd)))
        sh = list(shape) + [0] * (3 - len(shape))
        rows.append('    {"%s", "%s", %d, {%d, %d, %d}, %s, %s, %s, %s, %s, %s, %s, %d, %d, %s_p0, %s_g, %s_p32, '
                    '%s_s32, %s_p64, %s_s64}'
                    % (name, what, len(shape), sh[0], sh[1], sh[2], cd(o["lr"]), cd(o["beta2_decay"]),
                       cd(o["eps1"] or 0.0), cd(o["eps2"]), cd(o["d"]), cd(o["weight_decay"]),
                       cd(o["beta1"]), n, ns, c, c, c, c, c, c))
    out.append("static const adafactor_ref_case adafactor_ref_cases[] = {\n" + ",\n".join(rows) + "};\n")
    print("".join(out), end="")


if __name__ == "__main__":
    main()
