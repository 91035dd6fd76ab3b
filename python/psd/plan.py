"""The order of a planned BSP job's samples, and the plan's named tuples.

psd's plan (proto/PROTOCOL.md section 8, "The plan") says which positions
of an epoch's order of the training set each worker trains in each round;
the order itself is the clients': every worker of a job must compute the
same permutation of [0, samples) from (seed, epoch). epoch_order() is that
permutation, defined exactly as psworker's seeded shuffle, so Python and C
workers can share one job:

- a xoshiro256** generator (Blackman and Vigna) whose four state words are
  four consecutive splitmix64 outputs from a start value h, where
  h = m(m(m(seed) ^ 0) ^ epoch) and m(x) is one splitmix64 step from x
  (x + 0x9e3779b97f4a7c15, then the two multiply-xorshift rounds);
- a Fisher-Yates shuffle of 0..samples-1: for i from samples down to 2,
  j = a uniform draw below i, swap positions i-1 and j. A draw below n
  takes the next 64-bit output v, rejects it while v < 2^64 mod n, and
  returns v mod n.

All arithmetic is modulo 2^64. It runs in Python, about half a second per
million samples (see epoch_order), once per epoch; Client.plan_batches
keeps the current epoch's order.
"""

import collections

import numpy as np

__all__ = ["Plan", "Slice", "epoch_order"]

Plan = collections.namedtuple("Plan", "epochs samples batch seed")
Plan.__doc__ = """A BSP job's plan: `epochs` passes over `samples` samples, `batch`
(the global batch, all workers together) in each round, the order drawn
from `seed` and the epoch. Rounds per epoch: ceil(samples / batch)."""
Plan.rounds_per_epoch = property(lambda p: -(-p.samples // p.batch))
Plan.rounds = property(lambda p: p.epochs * -(-p.samples // p.batch))

Slice = collections.namedtuple("Slice", "epoch lo hi rank count")
Slice.__doc__ = """This worker's part of a round: positions [lo, hi) of epoch `epoch`'s
order (epochs from 0), part `rank` of `count`. lo == hi: nothing to train
this round (push a zero gradient)."""

_M64 = (1 << 64) - 1


def _splitmix64(x):
    """One splitmix64 step: (new counter, output)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return x, z ^ (z >> 31)


def _seed3(seed, a, b):
    _, h = _splitmix64(seed & _M64)
    _, h = _splitmix64(h ^ (a & _M64))
    _, h = _splitmix64(h ^ (b & _M64))
    s = []
    x = h
    for _ in range(4):
        x, v = _splitmix64(x)
        s.append(v)
    return s


def epoch_order(samples, seed, epoch):
    """The permutation of range(samples) that every worker of a planned job
    trains epoch `epoch` (from 0) in, drawn from `seed`: a numpy int64
    array, the same as psworker's order for the same seed and epoch (the
    module's docstring defines it). Position p of the order is sample
    order[p]; a round's slice [lo, hi) is order[lo:hi]."""
    samples, seed, epoch = int(samples), int(seed), int(epoch)
    if samples < 0:
        raise ValueError("samples must be >= 0, not %d" % samples)
    if seed < 0 or epoch < 0:
        raise ValueError("seed and epoch must be >= 0, not %d and %d" % (seed, epoch))
    s0, s1, s2, s3 = _seed3(seed, 0, epoch)
    perm = list(range(samples))
    m = _M64
    for i in range(samples, 1, -1):
        threshold = (1 << 64) % i
        while True:
            # xoshiro256**: the output, then the state's step
            r = (((s1 * 5) & m) << 7 | ((s1 * 5) & m) >> 57) & m
            r = (r * 9) & m
            t = (s1 << 17) & m
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = ((s3 << 45) | (s3 >> 19)) & m
            if r >= threshold:
                break
        j = r % i
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return np.array(perm, dtype=np.int64)
