"""AttnLRP against its anchor (LXT 2.1 with zennit's gamma on torchvision's ViT) and against hand-written LRP.

The hand-written propagation writes every rule out as a relevance message (``R_in`` from ``R_out``,
never a gradient) on a two-block toy transformer: softmax, layer norm, GELU, both attention
products, residual additions, mean pooling and linear layers.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from attnlrp_helpers import lxt_relevance, torchvision_vit
from torch import Tensor, nn

import camkit

pytest.importorskip("lxt")
pytest.importorskip("zennit")


def _gap(new: Tensor, ref: Tensor) -> float:
    """Largest difference over the reference map's scale."""
    return float((new - ref).abs().amax() / ref.abs().amax())


@pytest.mark.parametrize("attention", ["cp", "attnlrp"])
def test_equal_to_lxt_on_torchvision_vit(attention: str) -> None:
    model = torchvision_vit()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for conv_gamma in (0.25, 0.0):
        ref = lxt_relevance(model, x, 1, conv_gamma=conv_gamma, gamma=0.0, attention=attention, stabilizer=1e-9)
        e = camkit.AttnLRP(model, attention, "gamma", conv_gamma=conv_gamma, gamma=0.0, epsilon=1e-9).explain(
            x, target=1
        )
        assert _gap(e.raw, ref) < 1e-5, (conv_gamma, _gap(e.raw, ref))
    # the variants differ: relevance through queries and keys or not
    other = "attnlrp" if attention == "cp" else "cp"
    assert _gap(lxt_relevance(model, x, 1, conv_gamma=0.25, gamma=0.0, attention=other, stabilizer=1e-9), ref) > 1e-3


def test_gamma_on_attention_projections_is_where_lxt_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With gamma > 0 on linear layers LXT's torchvision recipe leaves ``nn.MultiheadAttention``'s projections on
    the plain gradient (zennit's hooks sit on modules, and those projections are ``F.linear`` calls inside the
    attention); camkit gives them the rule of every other linear layer. That is the whole difference."""
    from camkit.methods.attribution import attnlrp

    model = torchvision_vit()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ref = lxt_relevance(model, x, 2, conv_gamma=0.25, gamma=0.05)
    explainer = camkit.AttnLRP(model, "cp", "gamma", conv_gamma=0.25, gamma=0.05)
    assert _gap(explainer.explain(x, target=2).raw, ref) > 1e-2
    monkeypatch.setattr(attnlrp._AttnLRPMode, "_linear", lambda self, a, w, b, dependent: F.linear(a, w, b))
    assert _gap(explainer.explain(x, target=2).raw, ref) < 1e-5


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, h: Tensor) -> Tensor:
        u = self.ln1(h)
        a = torch.softmax(self.q(u) @ self.k(u).transpose(-2, -1) / math.sqrt(h.shape[-1]), dim=-1)
        h = h + self.o(a @ self.v(u))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class _Toy(nn.Module):
    """Two transformer blocks over the tokens of x [B, D, N] (channels are features), mean pooling, a linear head."""

    def __init__(self, d: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(d), _Block(d)])
        self.head = nn.Linear(d, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.transpose(1, 2)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(dim=1))


# The rules as relevance messages, for one sample (tokens [N, D]); epsilon = 0.
def _linear(a: Tensor, layer: nn.Linear, r: Tensor) -> Tensor:
    z = a @ layer.weight.T + layer.bias  # R_a[n, i] = sum_j a[n, i] W[j, i] R[n, j] / z[n, j]
    return torch.einsum("ni,ji,nj->ni", a, layer.weight, r / z)


def _add(a: Tensor, b: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    return a / (a + b) * r, b / (a + b) * r


def _layer_norm(x: Tensor, ln: nn.LayerNorm, r: Tensor) -> Tensor:
    """y = M x + b with M = diag(w / std) (I - 1/D), std held constant: the epsilon rule on that linear map."""
    d = x.shape[-1]
    std = (x.var(dim=-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    centre = torch.eye(d, dtype=x.dtype) - 1.0 / d
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        m = (ln.weight / std[n])[:, None] * centre  # [j, i]
        y = m @ x[n] + ln.bias
        out[n] = torch.einsum("i,ji,j->i", x[n], m, r[n] / y)
    return out


def _product(a: Tensor, b: Tensor, r: Tensor, share_a: float) -> tuple[Tensor, Tensor]:
    """out[n, d] = sum_m a[n, m] b[m, d]: the term a[n, m] b[m, d] gets its share of R[n, d]; ``share_a`` of it to a."""
    terms = torch.einsum("nm,md->nmd", a, b) * (r / (a @ b))[:, None, :]
    return share_a * terms.sum(dim=2), (1 - share_a) * terms.sum(dim=0)


def _softmax(logits: Tensor, s: Tensor, r: Tensor) -> Tensor:
    return logits * (r - s * r.sum(dim=-1, keepdim=True))


def _block(block: _Block, h: Tensor, r_out: Tensor, cp: bool) -> Tensor:
    d = h.shape[-1]
    u1 = block.ln1(h)
    q, k, v = block.q(u1), block.k(u1), block.v(u1)
    logits = q @ k.T / math.sqrt(d)
    s = logits.softmax(dim=-1)
    ctx = s @ v
    mid = h + block.o(ctx)
    u2 = block.ln2(mid)
    f1 = block.fc1(u2)
    g = F.gelu(f1)
    r_mid, r_f2 = _add(mid, block.fc2(g), r_out)
    r_g = _linear(g, block.fc2, r_f2)  # GELU: identity rule, R_f1 = R_g
    r_mid = r_mid + _layer_norm(mid, block.ln2, _linear(u2, block.fc1, r_g))
    r_h, r_att = _add(h, block.o(ctx), r_mid)
    r_s, r_v = _product(s, v, _linear(ctx, block.o, r_att), 0.0 if cp else 0.5)
    r_u1 = _linear(u1, block.v, r_v)
    if not cp:
        r_logits = _softmax(logits, s, r_s)
        r_q, r_kt = _product(q / math.sqrt(d), k.T, r_logits, 0.5)
        r_u1 = r_u1 + _linear(u1, block.q, r_q) + _linear(u1, block.k, r_kt.T)
    return r_h + _layer_norm(h, block.ln1, r_u1)


def _hand(model: _Toy, x: Tensor, target: int, cp: bool) -> Tensor:
    out = []
    with torch.no_grad():
        for sample in x:
            hs = [sample.T]
            for block in model.blocks:
                hs.append(block(hs[-1][None])[0])
            pooled = hs[-1].mean(dim=0)
            logit = model.head(pooled)[target]
            r_pooled = pooled * model.head.weight[target] / logit * logit  # the head, R = the score
            r = hs[-1] / hs[-1].shape[0] / pooled * r_pooled  # mean pooling: shares of the mean
            for block, h in zip(reversed(model.blocks), reversed(hs[:-1])):
                r = _block(block, h, r, cp)
            out.append(r.T)
    return torch.stack(out)


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
def test_equal_to_hand_written_propagation(attention: str) -> None:
    torch.manual_seed(0)
    model = _Toy().double().eval()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    e = camkit.AttnLRP(model, attention, epsilon=0.0).explain(x, target=torch.tensor([2, 0]))
    hand = torch.stack([_hand(model, x[i : i + 1], t, attention == "cp")[0] for i, t in enumerate((2, 0))])
    assert torch.allclose(e.raw, hand, rtol=1e-9, atol=1e-12), (e.raw - hand).abs().max()
    assert torch.allclose(e.extras["relevance"], hand.sum(dim=(1, 2)))


def test_generalized_gamma_by_hand() -> None:
    """One linear layer, inputs of both signs: the rule's contributions written out unit by unit."""
    a = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    layer = nn.Linear(3, 2).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -1.0, 2.0], [-0.5, 0.25, -3.0]]))
        layer.bias.copy_(torch.tensor([0.5, -0.25]))
    gamma = 0.5
    z = layer(a)[0].detach()
    expected = torch.zeros(3, dtype=torch.float64)
    for j in range(2):
        w, b = layer.weight[j].detach(), layer.bias[j].detach()
        sign = 1.0 if z[j] > 0 else -1.0
        # on z > 0: positive inputs through w + g w+, negative ones through w + g w-; mirrored on z < 0
        boost_pos = w + gamma * (w.clamp(min=0) if sign > 0 else w.clamp(max=0))
        boost_neg = w + gamma * (w.clamp(max=0) if sign > 0 else w.clamp(min=0))
        contrib = torch.where(a[0] > 0, a[0] * boost_pos, a[0] * boost_neg)
        bias = b + gamma * (b.clamp(min=0) if sign > 0 else b.clamp(max=0))
        expected += contrib / (contrib.sum() + bias) * z[j]  # R_j = z_j: the gradient of z.sum()
    net = nn.Sequential(nn.Flatten(), layer)
    e = camkit.AttnLRP(net, rule="gamma", gamma=gamma, epsilon=0.0).explain(
        a.view(1, 3, 1), target=lambda out: out.sum(dim=1)
    )
    assert torch.allclose(e.raw.flatten(), expected)


def test_fused_and_unfused_attention_give_the_same_map() -> None:
    """timm's fused attention (scaled_dot_product_attention, written out by AttnLRP) equals its own unfused path."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=16,
                              depth=2, num_heads=2, num_classes=4).double().eval()  # fmt: skip
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for attention in ("attnlrp", "cp"):
        fused = camkit.AttnLRP(model, attention).explain(x, target=1).raw
        try:
            for block in model.blocks:
                block.attn.fused_attn = False
            eager = camkit.AttnLRP(model, attention).explain(x, target=1).raw
        finally:
            for block in model.blocks:
                block.attn.fused_attn = True
        assert torch.allclose(fused, eager, rtol=1e-9, atol=1e-12)


class _HandRMSNorm(nn.Module):
    """RMS norm written out as LLaMA-style code does (``rsqrt`` of the mean square), not ``F.rms_norm``."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, h: Tensor) -> Tensor:
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class _Gated(nn.Module):
    """RMS norm, a gated MLP ``down(silu(gate(u)) * up(u))`` with a residual, mean pooling and a head; no biases."""

    def __init__(self, norm: nn.Module, d: int = 4) -> None:
        super().__init__()
        self.norm = norm
        self.gate, self.up = nn.Linear(d, 6, bias=False), nn.Linear(d, 6, bias=False)
        self.down, self.head = nn.Linear(6, d, bias=False), nn.Linear(d, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = x.transpose(1, 2)
        u = self.norm(h)
        return self.head((h + self.down(F.silu(self.gate(u)) * self.up(u))).mean(dim=1))


def _no_bias(a: Tensor, layer: nn.Linear, r: Tensor) -> Tensor:
    return torch.einsum("ni,ji,nj->ni", a, layer.weight, r / (a @ layer.weight.T))


@pytest.mark.parametrize("norm", ["module", "by hand"])
def test_gated_mlp_and_rms_norm_by_hand(norm: str) -> None:
    torch.manual_seed(0)
    model = _Gated(nn.RMSNorm(4, eps=1e-6) if norm == "module" else _HandRMSNorm(4)).double().eval()
    if norm == "module":
        with torch.no_grad():
            model.norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(1, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        h = x[0].T
        u = model.norm(h)
        g, p = model.gate(u), model.up(u)
        m = F.silu(g) * p
        y = model.down(m)
        pooled = (h + y).mean(dim=0)
        score = model.head(pooled)[1]
        r_sum = (h + y) / 3 / pooled * (pooled * model.head.weight[1])  # head and mean pooling, R = score
        r_h, r_y = _add(h, y, r_sum)
        r_m = _no_bias(m, model.down, r_y)
        # the product: half to each factor; SiLU: identity; RMS norm: elementwise, identity
        r_u = _no_bias(u, model.gate, r_m / 2) + _no_bias(u, model.up, r_m / 2)
        hand = (r_h + r_u).T
    e = camkit.AttnLRP(model, epsilon=0.0).explain(x, target=1)
    assert torch.allclose(e.raw[0], hand, rtol=1e-9, atol=1e-12), (e.raw[0] - hand).abs().max()
    assert torch.allclose(hand.sum(), score)  # no biases: conserved
