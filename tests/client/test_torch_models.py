"""test_torch_models.py - models people train, through psd.torch with the
default options (ctest: client_torch_models): torchvision's ResNet-50
(161 parameters and 159 BatchNorm buffers, 25.6 M values) and a 12-layer
nn.TransformerEncoder language model whose nested names pass 79 bytes, in
asgd and bsp. Their loss falls, and the file `psctl save` writes loads
into a fresh model with load_state_dict(strict=True).

Both run in the plain build only: their library calls are those of
client_torch and client_python's layout test at the limits (which run in
both builds), and under the sanitizer's malloc PyTorch's own work makes
them take minutes (the transformer's two runs took 184 s there).

Sizes are small so that the suite stays fast: ResNet-50 on 32x32 images,
batch 4, 40 steps learning one fixed batch (its loss must halve within the steps;
it falls from 26.6 to below 0.001 in 30);
the transformer with d_model 32 on 16-token sequences of a 50-word
vocabulary with a planted next-token rule.
"""

import os
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

import psd.torch  # noqa: E402

ARGS = ("--set", "optimizer=sgd", "--set", "lr=0.05", "--set", "momentum=0.9", "--set", "warmup_versions=0",
        "--log-level", "warn")


@pytest.fixture
def cluster():
    with harness.Cluster("psd-torch-models") as cl:
        yield cl


def saved_loads_strictly(p, cluster, fresh, trained):
    """psctl save's file loads into fresh with strict=True and holds the
    trained module's parameters and buffers (as psd has them)."""
    path = os.path.join(cluster.dir, "model.safetensors")
    r = harness.psctl(p.addr, "save", path)
    assert r.returncode == 0, r.stderr
    _, t = harness.read_safetensors(path)
    fresh.load_state_dict({n: torch.from_numpy(np.array(a)) for n, a in t.items()}, strict=True)
    want = trained.state_dict()
    for n, v in fresh.state_dict().items():
        assert v.dtype == want[n].dtype, n
        torch.testing.assert_close(v, want[n], rtol=1e-6, atol=1e-6, msg=n)


def resnet50():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet50(num_classes=4)


@pytest.mark.plain_build
@pytest.mark.parametrize("mode", ["asgd", "bsp"])
def test_resnet50(cluster, mode):
    pytest.importorskip("torchvision", reason="no torchvision (Debian python3-torchvision)")
    torch.set_num_threads(1)  # no OpenMP spinning on a shared machine
    p = cluster.psd(mode=mode, workers=1, args=ARGS)
    model = resnet50()
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    assert len(names) == 320
    ps = psd.torch.Worker(model, server=p.addr, shard="0/1", connect_s=5, wait_notice=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.tensor([0, 1, 2, 3])
    losses, t0 = [], time.monotonic()
    steps = 40
    for _ in range(steps):
        model.train()
        ps.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        ps.step()
        losses.append(loss.item())
    dt = time.monotonic() - t0
    print("resnet50 %s: loss %.3f -> %.3f in %d steps, %.0f ms a step" % (mode, np.mean(losses[:3]),
                                                                        np.mean(losses[-3:]), steps,
                                                                        dt / steps * 1000))
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses
    assert int(model.bn1.num_batches_tracked) == steps
    saved_loads_strictly(p, cluster, resnet50(), model)
    ps.close()


VOCAB, SEQ, DM = 50, 16, 32


class LM(nn.Module):
    """A 12-layer transformer language model, nested as library models are
    (names such as model.transformer_backbone.language_model.encoder.
    layers.11.self_attn.out_proj.weight, 85 bytes); its causal mask is a
    buffer that is not part of its state (persistent=False)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Module()
        self.model.transformer_backbone = nn.Module()
        self.model.transformer_backbone.language_model = nn.Module()
        lm = self.model.transformer_backbone.language_model
        lm.embed_tokens = nn.Embedding(VOCAB, DM)
        lm.embed_positions = nn.Embedding(SEQ, DM)
        layer = nn.TransformerEncoderLayer(DM, 2, 64, dropout=0.0, batch_first=True)
        lm.encoder = nn.TransformerEncoder(layer, 12, norm=nn.LayerNorm(DM), enable_nested_tensor=False)
        self.lm_head = nn.Linear(DM, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens):
        lm = self.model.transformer_backbone.language_model
        h = lm.embed_tokens(tokens) + lm.embed_positions(torch.arange(tokens.shape[1]))
        return self.lm_head(lm.encoder(h, mask=self.mask))


def tokens(step):
    """Sequences where each token is the one before plus 3 (mod VOCAB)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (8, 1), generator=g)
    return (start + 3 * torch.arange(SEQ + 1)) % VOCAB


@pytest.mark.plain_build
@pytest.mark.parametrize("mode", ["asgd", "bsp"])
def test_transformer_lm(cluster, mode):
    torch.set_num_threads(1)  # no OpenMP spinning on a shared machine
    p = cluster.psd(mode=mode, workers=1, args=ARGS)
    model = LM()
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == 12 * 12 + 6
    assert max(len(n) for n in names) >= 79, max(names, key=len)
    ps = psd.torch.Worker(model, server=p.addr, shard="0/1", connect_s=5, wait_notice=False)
    losses = []
    steps = 150
    for step in range(steps):
        seq = tokens(step)
        ps.zero_grad()
        loss = F.cross_entropy(model(seq[:, :-1]).reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        loss.backward()
        ps.step()
        losses.append(loss.item())
    print("transformer %s: loss %.3f -> %.3f in %d steps" % (mode, np.mean(losses[:5]), np.mean(losses[-5:]),
                                                             steps))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    saved_loads_strictly(p, cluster, LM(), model)
    ps.close()
