"""test_torch.py - psd.torch against a real psd (ctest: client_torch).

psd runs plain SGD at lr 0.5 without momentum, so after a step every
parameter must be exactly p - 0.5 x grad (x the mean over workers in bsp).
"""

import os
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

import psd  # noqa: E402
import psd.torch  # noqa: E402

SGD = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--set", "warmup_versions=0",
       "--log-level", "warn")


@pytest.fixture
def cluster():
    with harness.Cluster("psd-torch") as cl:
        yield cl


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 4))


def data(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)


def test_views_and_one_step(cluster):
    p = cluster.psd(mode="asgd", workers=2, args=SGD)
    model = net()
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    w = psd.torch.Worker(model, server=p.addr, shard="0/2")
    assert w.mode == "asgd" and w.client.shm
    names = [n for n, _ in model.named_parameters()]
    assert list(w.client.tensors) == names
    base = w.flat_params.data_ptr()
    for (n, t), g in zip(model.named_parameters(), w._grad_views):
        off, cnt = w.client.offset(n)
        assert t.data_ptr() == base + 4 * off                 # a view of the library's vector
        assert t.grad.data_ptr() == w.flat_grads.data_ptr() + 4 * off
        assert torch.equal(t.detach(), before[n])             # our values became psd's model
    x, y = data(1)
    w.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    grads = {n: t.grad.clone() for n, t in model.named_parameters()}
    ptrs = [t.data_ptr() for t in model.parameters()]
    w.step()
    assert [t.data_ptr() for t in model.parameters()] == ptrs  # updated in place
    for n, t in model.named_parameters():
        assert torch.equal(t.detach(), before[n] - 0.5 * grads[n]), n
    assert w.version == 1
    # a second worker with other initial values gets the model
    other = net(seed=7)
    w2 = psd.torch.Worker(other, server=p.addr, shard="1/2")
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a.detach(), b.detach())
    # a gradient replaced (set to None, or a new tensor) still goes out
    w2.zero_grad()
    for t in other.parameters():
        t.grad = None
    nn.functional.cross_entropy(other(x), y).backward()
    g2 = {n: t.grad.clone() for n, t in other.named_parameters()}
    now = {n: t.detach().clone() for n, t in other.named_parameters()}
    w2.step()
    for n, t in other.named_parameters():
        assert torch.equal(t.detach(), now[n] - 0.5 * g2[n]), n
    w.close()
    w2.close()


def test_bsp_two_workers_mean(cluster):
    p = cluster.psd(mode="bsp", workers=2, args=SGD)
    models = [net(), net()]
    workers = [psd.torch.Worker(m, server=p.addr, shard="%d/2" % k) for k, m in enumerate(models)]
    start = [t.detach().clone() for t in models[0].parameters()]
    grads = []
    for k, (m, w) in enumerate(zip(models, workers)):
        w.zero_grad()
        x, y = data(10 + k)
        nn.functional.cross_entropy(m(x), y).backward()
        grads.append([t.grad.clone() for t in m.parameters()])
    workers[0].step_start()                                   # waits for the round
    time.sleep(0.2)
    assert not workers[0].client.poll()
    workers[1].step()
    workers[0].step_wait()
    for m in models:
        for t, s, g0, g1 in zip(m.parameters(), start, grads[0], grads[1]):
            assert torch.allclose(t.detach(), s - 0.5 * (g0 + g1) / 2, atol=1e-6)
    assert workers[0].version == workers[1].version == 1


def test_bsp_by_psds_plan(cluster):
    """A psd.torch.Worker made with connect=False follows psd's plan
    through its client: one worker trains every round's whole global batch
    of the plan's order and stops at the plan's last round."""
    p = cluster.psd(mode="bsp", workers=1, args=SGD)
    model = net()
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(21, 20, generator=g), torch.randint(0, 4, (21,), generator=g)
    w = psd.torch.Worker(model, connect=False, server=p.addr, shard="0/1")
    w.client.plan_set(2, 21, 5, 9)               # 5 rounds an epoch, the last of 1 sample
    w.connect()
    seen = []
    for idx in w.client.plan_batches(len(x)):
        sl = w.client.plan_slice()
        assert (sl.rank, sl.count) == (0, 1)
        seen.append((sl.epoch, list(idx)))
        w.zero_grad()
        nn.functional.cross_entropy(model(x[torch.from_numpy(idx)]), y[torch.from_numpy(idx)]).backward()
        w.step()
    assert w.client.plan_done() and w.version == 10
    for e in (0, 1):
        order = list(psd.epoch_order(21, 9, e))
        assert [i for ep, idx in seen if ep == e for i in idx] == order    # each epoch: the whole order
        assert [len(idx) for ep, idx in seen if ep == e] == [5, 5, 5, 5, 1]
    w.close()


def test_split_and_ssp(cluster):
    p1 = cluster.psd(mode="ssp", workers=1, name="psd1", args=SGD)
    p2 = cluster.psd(mode="ssp", workers=1, name="psd2", args=SGD)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 10))  # 4810 values: two parts
    start = [t.detach().clone() for t in model.parameters()]
    w = psd.torch.Worker(model, server="%s,%s" % (p1.addr, p2.addr), shard="0/1")
    assert w.client.servers == 2 and w.mode == "ssp"
    w.zero_grad()
    model(torch.ones(3, 64)).sum().backward()
    grads = [t.grad.clone() for t in model.parameters()]
    w.step()
    for t, s, g in zip(model.parameters(), start, grads):
        assert torch.equal(t.detach(), s - 0.5 * g)


def test_heartbeats_while_computing(cluster):
    """psd's heartbeat timeout is 1 s; the model 'computes' for 2.5 s between
    steps, and psd still counts the worker (no reconnect needed)."""
    p = cluster.psd(mode="asgd", workers=1, args=SGD + ("--set", "heartbeat_timeout=1s"))
    model = net()
    w = psd.torch.Worker(model, server=p.addr, shard="0/1", reconnect=False)
    w.zero_grad()
    time.sleep(2.5)
    w.step()                     # reconnect off: a connection psd had closed would raise here
    st = harness.status(p.addr)
    assert [x["state"] for x in st["workers"]] != ["lost"], st
    assert w.client.reconnects == 0 and w.version == 1


def test_bad_modules():
    with pytest.raises(TypeError):
        psd.torch.Worker("not a module", connect=False)
    with pytest.raises(ValueError):
        psd.torch.Worker(nn.ReLU(), connect=False)
    with pytest.raises(TypeError, match="float32"):
        psd.torch.Worker(nn.Linear(3, 3).double(), connect=False)


def test_pipeline_steps_on_the_step_before(cluster):
    """pipeline=True: step() returns with the gradient in flight and the
    module on the parameters of the step before; finish() brings the
    newest. With plain SGD at lr 0.5 and one worker every value is exact:
    g1 and g2 are both computed on p0, g3 on p1 = p0 - 0.5 g1."""
    p = cluster.psd(mode="asgd", workers=1, args=SGD)
    model = net()
    p0 = [t.detach().clone() for t in model.parameters()]
    w = psd.torch.Worker(model, server=p.addr, shard="0/1", pipeline=True)
    grads, seen = [], []
    for s in range(3):
        seen.append([t.detach().clone() for t in model.parameters()])
        w.zero_grad()
        x, y = data(20 + s)
        nn.functional.cross_entropy(model(x), y).backward()
        grads.append([t.grad.clone() for t in model.parameters()])
        w.step()
    p1 = [a - 0.5 * g for a, g in zip(p0, grads[0])]
    p2 = [a - 0.5 * g for a, g in zip(p1, grads[1])]
    p3 = [a - 0.5 * g for a, g in zip(p2, grads[2])]
    for want, got in ((p0, seen[0]), (p0, seen[1]), (p1, seen[2])):
        for a, b in zip(want, got):
            assert torch.allclose(a, b, atol=1e-6)
    assert w._inflight
    w.finish()
    assert not w._inflight and w.version == 3
    for a, t in zip(p3, model.parameters()):
        assert torch.allclose(a, t.detach(), atol=1e-6)
    # the module's views moved to the other pair and back, psd saw 3 pushes
    # each with its true base version (no drop: ASGD applies them all)
    assert harness.status(p.addr)["version"] == 3
    # the explicit asynchronous step works on the module's pair too
    w.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    g4 = [t.grad.clone() for t in model.parameters()]
    w.step_start()
    w.step_wait()
    p4 = [a - 0.5 * g for a, g in zip(p3, g4)]
    for a, t in zip(p4, model.parameters()):
        assert torch.allclose(a, t.detach(), atol=1e-6)
    w.pull()
    for a, t in zip(p4, model.parameters()):
        assert torch.allclose(a, t.detach(), atol=1e-6)
    w.close(reason="pipeline test done")              # waits for psd's OK to the BYE
    rows = harness.status(p.addr)["workers"]
    assert [(x["state"], x["why"]) for x in rows] == [("left", "pipeline test done")], rows


def test_pipeline_refuses_bsp(cluster):
    p = cluster.psd(mode="bsp", workers=1, args=SGD)
    with pytest.raises(ValueError, match="asgd and ssp"):
        psd.torch.Worker(net(), server=p.addr, shard="0/1", pipeline=True)
    rows = harness.status(p.addr)["workers"]                  # it left, saying why
    assert [(x["state"], x["why"]) for x in rows] == [("left", "pipeline=True in a bsp job")], rows


def test_wait_notice_says_whom_the_step_waits_for(cluster, monkeypatch):
    """wait_notice=True: a BSP step that waits for a shard that has not
    joined says so on stderr as psworker's progress line does; the default
    (stderr not a terminal) and wait_notice=False say nothing."""
    p = cluster.psd(mode="bsp", workers=2, args=SGD + ("--set", "heartbeat_timeout=1s"))
    err = harness.LineStream()
    monkeypatch.setattr(sys, "stderr", err)
    m0 = net()
    w0 = psd.torch.Worker(m0, server=p.addr, shard="0/2", wait_notice=True)
    assert psd.torch.Worker(net(), connect=False, server=p.addr, shard="1/2")._notice is None
    assert psd.torch.Worker(net(), connect=False, server=p.addr, shard="1/2", wait_notice=False)._notice is None
    w0._notice.after = 0.5
    w0.zero_grad()
    x, y = data(3)
    nn.functional.cross_entropy(m0(x), y).backward()
    w0.step_start()
    try:
        want = "worker 0/2: waiting "
        deadline = time.monotonic() + 15
        while "round 0 waits for shard 1/2 (never joined)" not in err.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert " s for psd: round 0 waits for shard 1/2 (never joined)\n" in err.text, err.text
        assert all(line.startswith(want) for line in err.text.splitlines()), err.text
    finally:
        w1 = psd.torch.Worker(net(), server=p.addr, shard="1/2", wait_notice=False)
        w1.zero_grad()
        w1.step()
        w0.step_wait()
    assert w0.version == w1.version == 1 and w0.client.waiting_for() is None
    w0.close()
    assert w0._notice._thread is None                           # stopped with the worker


class CTR(nn.Module):
    """A bag of ad keys and a single user key, their rows in psd, a dense head."""

    def __init__(self, seed=0):
        super().__init__()
        self.ads = psd.torch.EmbeddingBag("ads", 4, mode="mean", init="uniform", scale=0.5, seed=3, opt="sgd",
                                          lr=0.5)
        self.user = psd.torch.Embedding("user", 4, init="normal", scale=0.3, seed=4, opt="sgd", lr=0.5)
        torch.manual_seed(seed)
        self.head = nn.Linear(8, 1)

    def forward(self, ads, offsets, user):
        return self.head(torch.cat([self.ads(ads, offsets), self.user(user)], 1)).squeeze(1)


class Reference(nn.Module):
    """The same model with its tables local: nn.EmbeddingBag and nn.Embedding."""

    def __init__(self, ads_rows, user_rows, head):
        super().__init__()
        self.ads = nn.EmbeddingBag(ads_rows.shape[0], 4, mode="mean")
        self.user = nn.Embedding(user_rows.shape[0], 4)
        self.head = nn.Linear(8, 1)
        with torch.no_grad():
            self.ads.weight.copy_(ads_rows)
            self.user.weight.copy_(user_rows)
            self.head.load_state_dict(head.state_dict())

    def forward(self, ads, offsets, user):
        return self.head(torch.cat([self.ads(ads, offsets), self.user(user)], 1)).squeeze(1)


def ctr_batch(step):
    g = torch.Generator().manual_seed(100 + step)
    lengths = torch.randint(1, 5, (8,), generator=g)
    ads = torch.randint(0, 30, (int(lengths.sum()),), generator=g)  # repeats within and across bags
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    user = torch.randint(0, 10, (8,), generator=g)
    y = torch.randint(0, 2, (8,), generator=g).float()
    return ads, offsets, user, y


def test_embedding_tables_train_like_local_ones(cluster):
    """psd.torch.EmbeddingBag (mean, offsets) and Embedding with their rows in
    psd train as nn.EmbeddingBag and nn.Embedding do with SGD, with a dense
    head through the Worker in the same step (ASGD, one worker, psd's SGD at
    the same learning rate): after 6 steps the rows and the head agree."""
    p = cluster.psd(mode="asgd", workers=1, args=SGD)
    model = CTR()
    ps = psd.torch.Worker(model, server=p.addr, shard="0/1", connect_s=5, timeout_ms=20000)
    assert [n for n, _ in model.named_parameters()] == ["head.weight", "head.bias"]
    ads_rows = torch.from_numpy(ps.client.pull_rows("ads", np.arange(30)))
    user_rows = torch.from_numpy(ps.client.pull_rows("user", np.arange(10)))
    ref = Reference(ads_rows, user_rows, model.head)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for step in range(6):
        ads, offsets, user, y = ctr_batch(step)
        ps.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(ads, offsets, user), y)
        loss.backward()  # keeps the rows' gradients
        ps.step()        # pushes the rows' and the head's, pulls the head back
        opt.zero_grad()
        rloss = nn.functional.binary_cross_entropy_with_logits(ref(ads, offsets, user), y)
        rloss.backward()
        opt.step()
        assert abs(loss.item() - rloss.item()) < 1e-5, step
    np.testing.assert_allclose(ps.client.pull_rows("ads", np.arange(30)), ref.ads.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ps.client.pull_rows("user", np.arange(10)), ref.user.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.head.weight.detach().numpy(), ref.head.weight.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    # 2-D input: fixed-size bags; no_grad pulls and pushes nothing
    with torch.no_grad():
        out = model.ads(torch.tensor([[1, 2], [3, 3]]))
    np.testing.assert_allclose(out.numpy(), ref.ads(torch.tensor([[1, 2], [3, 3]])).detach().numpy(), rtol=1e-5)
    with pytest.raises(ValueError):
        model.ads(torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        psd.torch.Worker(CTR(), connect=False, pipeline=True, server=p.addr, shard="0/1")
    ps.close()


def test_embedding_prefetch_pushes_and_pulls_in_one_round_trip(cluster):
    """prefetch(next input) before backward: backward pushes the pass's row
    gradients and pulls the next pass's rows in one pushpull_rows, and the
    next forward pulls nothing; training is the same as without (the local
    reference with SGD, as above). A forward whose keys are not the ones
    named pulls as usual."""
    p = cluster.psd(mode="asgd", workers=1, args=SGD)
    model = CTR()
    ps = psd.torch.Worker(model, server=p.addr, shard="0/1", connect_s=5, timeout_ms=20000)
    ref = Reference(torch.from_numpy(ps.client.pull_rows("ads", np.arange(30))),
                    torch.from_numpy(ps.client.pull_rows("user", np.arange(10))), model.head)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    calls = []
    for name in ("pull_rows", "push_rows", "pushpull_rows"):
        def counted(*a, _f=getattr(ps.client, name), _n=name):
            calls.append((_n, a[0]))
            return _f(*a)
        setattr(ps.client, name, counted)
    steps = 5
    for step in range(steps):
        ads, offsets, user, y = ctr_batch(step)
        ps.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(ads, offsets, user), y)
        if step + 1 < steps:
            nads, _, nuser, _ = ctr_batch(step + 1)
            model.ads.prefetch(nads)
            model.user.prefetch(nuser)
        loss.backward()
        ps.step()
        opt.zero_grad()
        rloss = nn.functional.binary_cross_entropy_with_logits(ref(ads, offsets, user), y)
        rloss.backward()
        opt.step()
        assert abs(loss.item() - rloss.item()) < 1e-5, step
    names = [c[0] for c in calls]
    # the first forward pulls; the steps between push and pull together; the last pushes
    assert names[:2] == ["pull_rows", "pull_rows"], calls
    assert names[2:2 + 2 * (steps - 1)] == ["pushpull_rows"] * (2 * (steps - 1)), calls
    assert names[2 + 2 * (steps - 1):] == ["push_rows", "push_rows"], calls
    np.testing.assert_allclose(ps.client.pull_rows("ads", np.arange(30)), ref.ads.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ps.client.pull_rows("user", np.arange(10)), ref.user.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    # named keys that the next forward does not take: it pulls its own
    calls.clear()
    ads, offsets, user, y = ctr_batch(7)
    model.ads.prefetch(ctr_batch(8)[0])
    with torch.no_grad():
        out = model.ads(ads, offsets)
    np.testing.assert_allclose(out.numpy(), ref.ads(ads, offsets).detach().numpy(), rtol=1e-5)
    assert calls == [("pull_rows", "ads")], calls
    ps.close()


# ---- buffers: BatchNorm's running statistics through psd ----------------------

BN_WORKER = r"""
import json, sys
import torch, torch.nn as nn, torch.nn.functional as F
import psd, psd.torch
from psd import mnist
addr, shard, datadir, rule = sys.argv[1:5]
k = int(shard.split("/")[0])
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))
x, y = mnist.load(datadir, "train", limit=4000, dataset="fashion-mnist")
tx, ty = mnist.load(datadir, "t10k", limit=2000, dataset="fashion-mnist")
x, y, tx, ty = map(torch.from_numpy, (x, y, tx, ty))
ps = psd.torch.Worker(model, server=addr, shard=shard, buffers=rule, wait_notice=False)
mine = torch.arange(k, len(x), 2)
g = torch.Generator().manual_seed(k)
for epoch in range(2):
    order = mine[torch.randperm(len(mine), generator=g)]
    for i in range(0, len(order) - 63, 64):
        idx = order[i:i + 64]
        model.train()
        ps.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        ps.step()
print("trained", flush=True)
sys.stdin.readline()   # every worker is done (and the test saved the model)
ps.pull()
model.eval()
with torch.no_grad():
    acc = (model(tx).argmax(1) == ty).double().mean().item() * 100
bn = model[2]
print(json.dumps({"acc": acc, "nbt": int(bn.num_batches_tracked), "mean": bn.running_mean.tolist()}), flush=True)
ps.close()
"""


def bn_net():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))


@pytest.mark.parametrize("mode,rule", [("asgd", "mean"), ("bsp", "mean"), ("bsp", "first")])
def test_batchnorm_buffers_saved_and_loaded_strictly(cluster, mode, rule):
    """Two psd.torch workers train a module with BatchNorm: its running
    statistics go through psd (not each worker's own), the file psctl save
    writes loads with load_state_dict(strict=True), num_batches_tracked as
    int64, and the loaded module scores what the workers' final evaluation
    does."""
    import json
    import subprocess
    from psd import mnist
    p = cluster.psd(mode=mode, workers=2, args=("--set", "optimizer=adam", "--set", "lr=0.002", "--set",
                                                 "warmup_versions=0", "--log-level", "warn"))
    datadir = os.environ.get("PSD_DATA_DIR", os.path.join(harness.ROOT, "data"))
    env = dict(os.environ)
    ws = [subprocess.Popen(["/usr/bin/python3", "-c", BN_WORKER, p.addr, "%d/2" % k, datadir, rule],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           cwd=cluster.dir) for k in range(2)]
    try:
        for w in ws:
            line = w.stdout.readline()
            assert line == "trained\n", (line, w.stderr.read() if w.poll() is not None else "")
        path = os.path.join(cluster.dir, "bn.safetensors")
        r = harness.psctl(p.addr, "save", path)
        assert r.returncode == 0, r.stderr
        outs = []
        for w in ws:
            w.stdin.write("\n")
            w.stdin.flush()
            outs.append(json.loads(w.stdout.readline()))
            assert w.wait(60) == 0, w.stderr.read()
    finally:
        for w in ws:
            if w.poll() is None:
                w.kill()
    _, t = harness.read_safetensors(path)
    assert t["2.num_batches_tracked"].dtype == np.int64
    model = bn_net()
    model.load_state_dict({n: torch.from_numpy(np.array(a)) for n, a in t.items()}, strict=True)
    assert model[2].num_batches_tracked.dtype == torch.int64
    assert int(model[2].num_batches_tracked) == outs[0]["nbt"] == outs[1]["nbt"] > 0
    # psd's statistics, the same on both workers: not the initial zeros
    assert outs[0]["mean"] == outs[1]["mean"] == model[2].running_mean.tolist()
    assert max(abs(v) for v in outs[0]["mean"]) > 0.01
    model.eval()
    tx, ty = mnist.load(datadir, "t10k", limit=2000, dataset="fashion-mnist")
    with torch.no_grad():
        acc = (model(torch.from_numpy(tx)).argmax(1) == torch.from_numpy(ty)).double().mean().item() * 100
    print("batchnorm %s/%s: the saved model %.2f%%, the workers %s" % (mode, rule, acc,
                                                                     ", ".join("%.2f%%" % o["acc"] for o in outs)))
    assert acc > 70, acc
    for o in outs:
        assert abs(acc - o["acc"]) <= 0.1, (acc, outs)


def test_hogwild_module_is_psds_model(cluster):
    """hogwild = on: the module's parameters are psd's model segment itself;
    a step applies p - lr x grad there (no message), psd's version is the
    steps' count, and what one worker writes the other sees at once."""
    p = cluster.psd(mode="asgd", workers=2, args=SGD + ("--set", "hogwild=on"))
    model = net()
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    w = psd.torch.Worker(model, server=p.addr, shard="0/2")
    assert w.client.hogwild and w.client.shm
    hw = w.client.hogwild_params()
    assert hw is not None and w.flat_params.data_ptr() == hw.ctypes.data
    for n, t in model.named_parameters():
        off, _ = w.client.offset(n)
        assert t.data_ptr() == hw.ctypes.data + 4 * off      # a view of psd's model
        assert torch.equal(t.detach(), before[n])
    x, y = data(1)
    w.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    grads = {n: t.grad.clone() for n, t in model.named_parameters()}
    w.step()
    for n, t in model.named_parameters():
        assert torch.equal(t.detach(), before[n] - 0.5 * grads[n]), n
    assert w.version == 1
    assert harness.status(p.addr)["version"] == 1
    other = net(seed=7)
    w2 = psd.torch.Worker(other, server=p.addr, shard="1/2")
    assert w2.client.hogwild
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a.detach(), b.detach())
    w2.zero_grad()
    nn.functional.cross_entropy(other(x), y).backward()
    now = {n: t.detach().clone() for n, t in other.named_parameters()}
    g2 = {n: t.grad.clone() for n, t in other.named_parameters()}
    w2.step()
    for n, t in model.named_parameters():                   # worker 0's module sees worker 1's step
        assert torch.equal(t.detach(), now[n] - 0.5 * g2[n]), n
    st = harness.status(p.addr)
    assert st["version"] == 2 and st["pushes"] == 0
    assert sorted(x["transport"] for x in st["workers"]) == ["hogwild", "hogwild"]
    with pytest.raises(ValueError, match="Hogwild"):
        psd.torch.Worker(net(), server=p.addr, shard="2/3", pipeline=True)
    w.close()
    w2.close()


LOCAL = ("--set", "optimizer=sgd", "--set", "momentum=0", "--log-level", "warn")


def both(fns):
    """Runs the calls at once (a BSP round wants both workers' pushes)."""
    import threading
    errors = []

    def run(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in ts)


def test_local_sgd_round_is_the_mean_model(cluster):
    """psd's local_steps = 2: each worker's own torch optimizer takes the
    steps; the first step sends nothing, the second averages the models."""
    p = cluster.psd(mode="bsp", workers=2, args=LOCAL + ("--set", "local_steps=2"))
    models = [net(), net()]
    workers = [psd.torch.Worker(m, server=p.addr, shard="%d/2" % k) for k, m in enumerate(models)]
    assert [w.client.local_steps for w in workers] == [2, 2]
    assert workers[0].client.elastic is None
    x, y = data(3)
    workers[0].zero_grad()
    nn.functional.cross_entropy(models[0](x), y).backward()
    with pytest.raises(ValueError, match="each worker trains its own model with its own optimizer"):
        workers[0].step()
    for w, m in zip(workers, models):
        w.optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    start = [t.detach().clone() for t in models[0].parameters()]
    local = []
    for step in range(2):
        for k, (m, w) in enumerate(zip(models, workers)):
            w.zero_grad()
            x, y = data(20 + 2 * step + k)
            nn.functional.cross_entropy(m(x), y).backward()
        if step == 0:
            for w in workers:
                w.step()  # no exchange: returns at once, nothing sent
                assert w.version == 0
            assert not all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))
            assert not all(torch.equal(a.detach(), s) for a, s in zip(models[0].parameters(), start))
        else:
            local = [[(t - 0.1 * t.grad).detach().clone() for t in m.parameters()] for m in models]
            both([workers[0].step, workers[1].step])
    assert workers[0].version == workers[1].version == 1
    for m in models:
        for t, a, b in zip(m.parameters(), local[0], local[1]):
            assert torch.allclose(t.detach(), (a + b) / 2, atol=1e-6)
    st = harness.status(p.addr)
    assert st["pushes"] == 2 and st["version"] == 1
    for w in workers:
        w.close()


def test_elastic_moves_towards_the_centre(cluster):
    """psd's elastic_alpha = 0.25, elastic_tau = 1: a step moves the local
    model a quarter of the way to psd's centre, and the centre as far
    towards it."""
    p = cluster.psd(mode="asgd", workers=1,
                    args=LOCAL + ("--set", "elastic_alpha=0.25", "--set", "elastic_tau=1"))
    m = net()
    w = psd.torch.Worker(m, server=p.addr, shard="0/1")
    w.optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    assert w.client.elastic == (0.25, 1) and w.client.local_steps == 0
    centre = [t.detach().clone() for t in m.parameters()]
    w.zero_grad()
    x, y = data(5)
    nn.functional.cross_entropy(m(x), y).backward()
    stepped = [(t - 0.1 * t.grad).detach().clone() for t in m.parameters()]
    w.step()
    for t, s, c in zip(m.parameters(), stepped, centre):
        e = 0.25 * (s - c)
        assert torch.allclose(t.detach(), s - e, atol=1e-6)
    w.close()
    saved = os.path.join(os.path.dirname(p.port_file), "centre.safetensors")
    r = harness.psctl(p.addr, "save", saved)
    assert r.returncode == 0, r.stderr
    _, tensors = harness.read_safetensors(saved)
    for (n, _), s, c in zip(m.named_parameters(), stepped, centre):
        e = 0.25 * (s - c)
        got = torch.from_numpy(np.array(tensors[n], dtype=np.float32)).reshape(c.shape)
        assert torch.allclose(got, c + e, atol=1e-6), n


def test_local_step_outside_averaging_jobs(cluster):
    """psc_local_step in a job of neither kind: ESTATE, saying what to do."""
    p = cluster.psd(mode="asgd", workers=1, args=SGD)
    c = psd.Client([("w", (4,))], server=p.addr, shard="0/1", connect=True)
    assert c.local_steps == 0 and c.elastic is None
    with pytest.raises(psd.PsdError, match="psd runs neither local SGD") as e:
        c.local_step()
    assert e.value.name == "ESTATE"
    c.close()
