"""An unmodified training script for `stallscope run --` under a kernel recorder that costs what CUPTI cost on an
H200 (tests/cupti_like.py, through STALLSCOPE_KERNEL_RECORDER=tests.cupti_like:CuptiLike): a DataLoader of tiny
batches, each step's work WORK_S (20% more inside a window). ``--own FILE``: the loop's own clock (when it asked for
each batch, time.perf_counter), written at the end."""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
from torch.utils.data import DataLoader, TensorDataset

from tests import cupti_like

WORK_S = 0.006

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--own", required=True)
args = p.parse_args()
loader = DataLoader(TensorDataset(torch.zeros(args.steps * 8, 4)), batch_size=8)
asked = []  # the loop asks for each batch (a step's start, as stallscope's), and once more at the end
it = iter(loader)
while True:
    asked.append(time.perf_counter())
    try:
        (x,) = next(it)
    except StopIteration:
        break
    cupti_like.work(WORK_S)
with open(args.own, "w") as f:
    json.dump({"asked": asked}, f)
