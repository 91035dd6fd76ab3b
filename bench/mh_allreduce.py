#!/usr/bin/python3
"""mh_allreduce.py - one rank's allreduce rounds over PyTorch's gloo backend, for bench/multihost.py.

    bench/mh_allreduce.py --master HOST:PORT --rank K --world M --size S --rounds R [--warmup W]

The reference a BSP round of psd is set against: every rank sums S float32
values with all the others (torch.distributed.all_reduce, gloo's ring
algorithm on CPU tensors), rounds back to back as psworker's BSP steps
are. Run one per host; GLOO_SOCKET_IFNAME picks the interface. Prints one
JSON object on stdout with the timed rounds' durations (seconds).
"""

import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank, world_size=a.world)
    x = torch.full((a.size,), 0.001 * (a.rank + 1), dtype=torch.float32)
    times = []
    for r in range(a.warmup + a.rounds):
        t0 = time.monotonic()
        dist.all_reduce(x)
        if r >= a.warmup:
            times.append(time.monotonic() - t0)
        x.mul_(1.0 / a.world)  # keep the values bounded
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "times": times}))


if __name__ == "__main__":
    main()
